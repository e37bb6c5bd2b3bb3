"""The graph code of the async towers (`trainer.step.asynchronous.async_update`): one update's compute, its apply in a
critical section, and a loop of several updates in one `tf.function` call.

The apply (optimizer update, BatchNorm statistics, global step + 1) runs in a `tf.CriticalSection`, a mutex
inside the graph: it lands whole, whichever thread or call it comes from, so a tower can chain compute and
apply in one call. A call of n updates costs one Python dispatch and one read of its results, where one
update per call paid both n times (`benchmarks/results/async.md`, "Where async's time goes").
"""

from __future__ import annotations

import tensorflow as tf

from trainer.step.core import calls, spread
from trainer.step.core import micro_batch as mb
from trainer.step.update.apply import loss_scale

# The per-update values a call returns, in this order, and their dtypes: step after the apply, loss, staleness,
# gradient norm; then each of the task's metrics' sum, then each one's count (`record_dtypes`).
RECORD_DTYPES = (tf.int64, tf.float32, tf.int64, tf.float32)


def record_dtypes(task) -> tuple:
    """The dtypes of one update's record for `task`: `RECORD_DTYPES`, then a sum and a count per metric."""
    return RECORD_DTYPES + (tf.float32,) * (2 * len(task.metric_names))


def record_values(m: dict, loss, metrics: dict) -> tuple:
    """One update's record (`record_dtypes`' order) from `apply`'s values, its loss and its task metrics."""
    return (
        m["step"],
        loss,
        m["staleness"],
        m["grad_norm"],
        *(s for s, _ in metrics.values()),
        *(c for _, c in metrics.values()),
    )


class TowerGraph:
    """What the async towers' graphs are built from, and the functions that build them (call them while a
    `tf.function` traces).

    Args:
      head: the `AsyncUpdate` (`trainer.step.update.apply.BaseUpdate`): task, model, optimizer, placement, global
        step, the towers' input streams, and its `apply_update`.
      halt: bool `tf.Variable`; once true, no update starts.
      micro_batch: the function each tower runs per micro-batch (`trainer.step.core.micro_batch.micro_batch_fn`).

    Attributes:
      micro_batch: read when a graph traces: replacing it before the first call changes every tower's
        micro-batch (`trainer.step.stepper.Updater.wrap_micro_batch`).
    """

    def __init__(self, head, halt, micro_batch):
        self.head, self.halt, self.micro_batch = head, halt, micro_batch
        self.seed_flags = [mb.is_seed_state(v) for v in head.model.non_trainable_variables]
        self.critical = tf.CriticalSection(name="async_apply")

    def compute(self, tower: int):
        """One micro-batch of `tower`: reads its input, the global step and the variables, computes on the
        tower. Returns (loss per weight, the task's {name: (sum, count)}, gradients per weight, new non-trainable
        values, the step the variables were read at): an async update is the mean over its own micro-batch."""
        head, iterator = self.head, self.head.iterators[tower]
        with tf.device(iterator.device):  # the CPU of the tower's own task
            batch = iterator.take(iterator.iterator)
        with tf.device(head.placement.parameter_device):
            step = head.global_step.read_value()
            scale = loss_scale(head.optimizer)
        trainable = spread.read_values(head.model.trainable_variables)
        non_trainable = spread.read_values(head.model.non_trainable_variables)
        with tf.device(head.placement.towers[tower]):
            state = mb.micro_batch_seeds(non_trainable, self.seed_flags, step, tower, len(head.placement.towers))
            result = self.micro_batch(trainable, state, batch, scale)
            grads = [mb.per_weight(g, result.weight) for g in result.grads]
            loss = mb.per_weight(result.loss, result.weight)
        return loss, result.metrics, grads, result.non_trainable, step

    def apply(self, loss, grads, non_trainable, read_step) -> dict:
        """Applies one update in the critical section (`BaseUpdate.apply_update`); returns its values and its
        staleness (updates applied by others between the read at `read_step` and this apply)."""
        new_state = [None if seed else value for value, seed in zip(non_trainable, self.seed_flags, strict=True)]

        def update():
            with tf.device(self.head.placement.parameter_device):
                return self.head.apply_update(loss, grads, new_state, loss_scale(self.head.optimizer))

        applied = self.critical.execute(update)
        return {**applied, "staleness": applied["step"] - read_step - 1}

    def one_update(self, tower: int) -> dict:
        """Compute and apply in one graph (the unbounded mode's update)."""
        loss, metrics, grads, non_trainable, read_step = self.compute(tower)
        return {"loss": loss, "metrics": metrics, **self.apply(loss, grads, non_trainable, read_step)}

    def updates(self, tower: int, num_updates, keep_gradients: bool) -> dict:
        """Up to `num_updates` updates of `tower` in an in-graph loop (`trainer.step.core.calls.in_graph_loop`),
        which ends early at an update that was not finite (not applied) or once `halt` is set (a stop
        request, a failed tower, shutdown).

        Returns {"count": updates run (the last one not applied if not `finite`), "finite", "records": one
        stacked tensor per `record_dtypes` entry, "learning_rate" and, if `keep_gradients`, "gradients" of
        the last update}.
        """

        def body(i, carried):
            records, learning_rate, gradients = carried
            m = self.one_update(tower)
            values = record_values(m, m["loss"], m["metrics"])
            records = tuple(r.write(i, v) for r, v in zip(records, values, strict=True))
            return m["finite"], (records, m["learning_rate"], m["gradients"] if keep_gradients else gradients)

        records = tuple(tf.TensorArray(dtype, size=0, dynamic_size=True) for dtype in record_dtypes(self.head.task))
        gradients = [tf.zeros_like(v) for v in self.head.model.trainable_variables] if keep_gradients else []
        start = (records, tf.constant(0.0), gradients)
        count, finite, (records, learning_rate, gradients) = calls.in_graph_loop(body, num_updates, self.halt, start)
        out = {"count": count, "finite": finite, "records": [r.stack() for r in records]}
        out["learning_rate"] = learning_rate
        return {**out, "gradients": gradients} if keep_gradients else out
