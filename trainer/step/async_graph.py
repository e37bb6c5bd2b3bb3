"""The graph code of an async tower (`trainer.step.asynchronous`): one update's compute, its apply in a
critical section, and a loop of several updates in one `tf.function` call.

The apply (optimizer update, BatchNorm statistics, global step + 1) runs in a `tf.CriticalSection`, a mutex
inside the graph: it lands whole, whichever thread or call it comes from, so a tower can chain compute and
apply in one call. A call of n updates costs one Python dispatch and one read of its results, where one
update per call paid both n times (`benchmarks/RESULTS.md`, "Where async's time goes").

Every function here takes the `AsyncUpdate` (`u`) whose variables, iterators and micro-batch function
(`u._micro_batch`, read when a function traces) it builds on.
"""

from __future__ import annotations

import tensorflow as tf

from trainer.step import spread
from trainer.step import towers as tw

# The per-update values a call returns, in this order, and their dtypes: step after the apply, loss, examples
# right, staleness, gradient norm.
RECORD_DTYPES = (tf.int64, tf.float32, tf.int32, tf.int64, tf.float32)


def compute(u, tower: int):
    """One micro-batch of `tower`: reads its input, the global step and the variables, computes on the tower.
    Returns (loss, correct, grads, new non-trainable values, the step the variables were read at)."""
    iterator = u.iterators[tower]
    with tf.device(iterator.device):  # the CPU of the tower's own task
        features, labels = iterator.take(iterator.iterator)
    with tf.device(u.placement.parameter_device):
        step = u.global_step.read_value()
        loss_scale = tw.loss_scale(u.optimizer)
    trainable = spread.read_values(u.model.trainable_variables)
    non_trainable = spread.read_values(u.model.non_trainable_variables)
    with tf.device(u.placement.towers[tower]):
        state = tw.micro_batch_seeds(non_trainable, u._seed_flags, step, tower, len(u.placement.towers))
        result = u._micro_batch(trainable, state, features, labels, loss_scale)
    return result.loss, result.correct, result.grads, result.non_trainable, step


def apply(u, loss, grads, non_trainable, read_step) -> dict:
    """Applies one update in the critical section; returns `tw.apply_update`'s values and its staleness
    (updates applied by others between the read at `read_step` and this apply)."""
    new_state = [None if seed else value for value, seed in zip(non_trainable, u._seed_flags, strict=True)]

    def update():
        with tf.device(u.placement.parameter_device):
            loss_scale = tw.loss_scale(u.optimizer)
            return tw.apply_update(
                u.model, u.optimizer, u.global_step, loss, grads, new_state, loss_scale, u.clip_global_norm
            )

    applied = u._critical.execute(update)
    return {**applied, "staleness": applied["step"] - read_step - 1}


def one_update(u, tower: int) -> dict:
    """Compute and apply in one graph (the unbounded mode's update)."""
    loss, correct, grads, non_trainable, read_step = compute(u, tower)
    return {"loss": loss, "correct": correct, **apply(u, loss, grads, non_trainable, read_step)}


def updates(u, tower: int, num_updates, keep_gradients: bool) -> dict:
    """Up to `num_updates` updates of `tower` in an in-graph loop, which ends early at an update that was not
    finite (not applied) or once `u.halt` is set (a stop request, a failed tower, shutdown).

    Returns {"count": updates run (the last one not applied if not `finite`), "finite", "records": one
    stacked tensor per `RECORD_DTYPES` entry, "learning_rate" and, if `keep_gradients`, "gradients" of the
    last update}.
    """

    def keep_going(i, finite, *_):
        return tf.logical_and(tf.logical_and(i < num_updates, finite), tf.logical_not(u.halt))

    def body(i, finite, records, learning_rate, gradients):
        m = one_update(u, tower)
        values = (m["step"], m["loss"], m["correct"], m["staleness"], m["grad_norm"])
        records = tuple(r.write(i, v) for r, v in zip(records, values, strict=True))
        return i + 1, m["finite"], records, m["learning_rate"], m["gradients"] if keep_gradients else gradients

    records = tuple(tf.TensorArray(dtype, size=0, dynamic_size=True) for dtype in RECORD_DTYPES)
    gradients = [tf.zeros_like(v) for v in u.model.trainable_variables] if keep_gradients else []
    start = (tf.constant(0), tf.constant(True), records, tf.constant(0.0), gradients)
    count, finite, records, learning_rate, gradients = tf.while_loop(keep_going, body, start)
    out = {"count": count, "finite": finite, "records": [r.stack() for r in records], "learning_rate": learning_rate}
    return {**out, "gradients": gradients} if keep_gradients else out
