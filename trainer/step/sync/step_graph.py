"""The traced sync step: read the micro-batches and the variables, run the micro-batches (`trainer.step.sync.runners`),
combine their results along the fixed tree (`trainer.step.core.combine`) and apply one update; and the in-graph
loop of several such steps in one call (`trainer.step.core.calls.in_graph_loop`)."""

from __future__ import annotations

import tensorflow as tf

from trainer.step.core import micro_batch as mb
from trainer.step.core import spread
from trainer.step.core.calls import in_graph_loop
from trainer.step.core.combine import combine
from trainer.step.update.apply import loss_scale


class StepGraph:
    """The graph code of one sync step (call its functions while a `tf.function` traces).

    Args:
      head: the `SyncUpdate` (`trainer.step.update.apply.BaseUpdate`): task, model, optimizer, placement, global
        step, input streams, and its `apply_update`.
      mirrors: the mirrored variables' replicas (`trainer.step.transfers.mirrors.Mirrors`).
      runner: how the step runs its micro-batches (`trainer.step.sync.runners.make_runner`).
      interrupted: bool `tf.Variable` the in-graph loop reads before every step.
    """

    def __init__(self, head, mirrors, runner, interrupted):
        self.head, self.mirrors, self.runner, self.interrupted = head, mirrors, runner, interrupted
        model = head.model
        self.seed_flags = [mb.is_seed_state(v) for v in model.non_trainable_variables]
        self.owners = (
            [spread.device_of(v) for v in model.trainable_variables],
            [spread.device_of(v) for v in model.non_trainable_variables],
            head.placement.parameter_device,
        )

    def zero_totals(self):
        """The running sums of a window before its first step: loss, the task's metrics, gradient norm."""
        return (tf.constant(0.0), mb.zero_metrics(self.head.task), tf.constant(0.0))

    def step(self, iterators, report, want_gradients: bool):
        """One step: returns its metrics, the towers' times (measured when `report`, a bool tensor or a bool: 0s
        when a false tensor, left out, with no clock ops, when the bool False) and, when `want_gradients`, the
        gradients."""
        head = self.head
        batches = []
        for placed, iterator in zip(head.iterators, iterators, strict=True):
            with tf.device(placed.device):  # the CPU of the task whose tower runs this micro-batch
                batches.append(placed.take(iterator))
        with tf.device(head.placement.parameter_device):
            step = head.global_step.read_value()
            scale = loss_scale(head.optimizer)
        trainable, non_trainable = self._copies()
        results, timings = self.runner.run(batches, trainable, non_trainable, step, report, scale)
        with tf.device(head.placement.parameter_device):
            metrics = self._apply(results, scale, non_trainable)
        metrics.update(timings)
        if not want_gradients:
            metrics.pop("gradients")
        return metrics

    def _copies(self):
        """Per task, one copy of every value, which its towers share (`trainer.step.core.tree.Layout.fanout`); one
        fanout of all the variables, so a fused one sends them together. Returns (trainable, non-trainable)."""
        model = self.head.model
        n = len(model.trainable_variables)
        values = spread.read_values(model.trainable_variables + model.non_trainable_variables)
        copies = self.mirrors.fanout(values, self.owners[0] + self.owners[1])
        return [c[:n] for c in copies], [c[n:] for c in copies]

    def _apply(self, results, scale, old_state):
        loss, metrics, grads, new_state, replica_grads = combine(
            results, self.seed_flags, old_state, self.owners, self.mirrors
        )
        also = lambda clip: self.mirrors.apply(replica_grads, clip)  # noqa: E731
        applied = self.head.apply_update(loss, grads, new_state, scale, also=also)
        bad = mb.first_non_finite([r.loss for r in results])
        return {"loss": loss, "metrics": metrics, "bad_micro_batch": bad, **applied}

    def steps(self, iterators, num_steps, totals, report):
        """Up to `num_steps` steps in one graph (`trainer.step.core.calls.in_graph_loop`): ends early at a step that
        was not finite (its update not applied) or once interrupted. When `report` (a bool tensor), the last
        step measures the towers' times. Every call of a window runs this one graph, so a start traces the step
        once (a second graph, one timed step apart from the loop, cost a 4-tower language model 10 CPU-seconds
        more at every start). Returns (steps run, finite, sums, last loss, step, bad micro-batch, the last
        step's learning rate and timings)."""

        def one_step(i, carried):
            m = self.step(iterators, tf.logical_and(report, tf.equal(i, num_steps - 1)), want_gradients=False)
            last = {name: m[name] for name in ("learning_rate", *timings)}
            return m["finite"], (add_step(carried[0], m), m["loss"], m["step"], m["bad_micro_batch"], last)

        timings = self.runner.no_timings()
        start = (totals, tf.constant(0.0), self.head.global_step.read_value(), -1, {"learning_rate": 0.0} | timings)
        ran, finite, carried = in_graph_loop(one_step, num_steps, self.interrupted, start)
        return (ran, finite, *carried)


def add_step(totals, metrics: dict):
    """A window's running sums (`StepGraph.zero_totals`) with one more step's metrics added."""
    loss, task_metrics, grad_norm = totals
    return (loss + metrics["loss"], mb.add_metrics(task_metrics, metrics["metrics"]), grad_norm + metrics["grad_norm"])
