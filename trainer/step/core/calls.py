"""How many steps one `tf.function` call runs (`--steps_per_call`), and the in-graph loop that runs them.

A call per step costs a Python round trip per step (the call, its argument handling, reading results): on a
20 ms step that is ~5% (`tower1_vs_plain` in benchmarks/results/headline.md). Several steps per call, in an in-graph
loop, pay it once per call, as Keras's `steps_per_execution` and orbit's `steps_per_loop` do. The result is
the same bits for every call size (`trainer.step.sync` carries the metric sums through the calls), so the size is
free to follow the measured step time.
"""

from __future__ import annotations

import tensorflow as tf

# Auto: calls of about this long. Short enough for the live progress line (redrawn after every call) and
# for the divergence check (read after every call); long enough that the per-call cost is noise.
TARGET_CALL_SEC = 0.5
FIRST_AUTO_STEPS = 4  # before any step time is known
MAX_AUTO_STEPS = 1000


class CallSize:
    """Steps per call: `steps_per_call` if positive, else auto (calls of ~`TARGET_CALL_SEC`, from the time per
    step of the last call that traced no graph). Steps in `profile_steps` (A, B), A+1..B, run one per call,
    so each has its own profiler step marker."""

    def __init__(self, steps_per_call: int = 0, profile_steps: tuple[int, int] | None = None):
        if steps_per_call < 0:
            raise ValueError(f"steps_per_call ({steps_per_call}) must be at least 0 (0: auto)")
        self.steps_per_call = steps_per_call
        self.profile_steps = profile_steps
        self.sec_per_step: float | None = None  # of the last timed call (auto)

    def size(self, step: int, remaining: int) -> int:
        """Steps the next call runs, from global step `step`, with `remaining` steps left in the window."""
        if self.profile_steps is not None:
            first, last = self.profile_steps
            if first <= step < last:
                return 1
            if step < first:  # stop at the first profiled step
                remaining = min(remaining, first - step)
        if self.steps_per_call:
            return min(self.steps_per_call, remaining)
        if self.sec_per_step is None:
            return min(FIRST_AUTO_STEPS, remaining)
        wanted = int(TARGET_CALL_SEC / max(self.sec_per_step, 1e-6))
        return max(1, min(wanted, MAX_AUTO_STEPS, remaining))

    def ran(self, steps: int, seconds: float) -> None:
        """Records a call that traced no graph: `steps` steps in `seconds`."""
        if steps > 0:
            self.sec_per_step = seconds / steps


def in_graph_loop(body, num_steps, halt, start):
    """Up to `num_steps` steps in one graph (call while a `tf.function` traces): a `tf.while_loop` that ends
    early after a step that was not finite (its update not applied) or once `halt` (a bool `tf.Variable`,
    read before every step) is true. Sync's steps and an async tower's updates both run in it.

    Args:
      body: (i, carried) -> (finite, carried): step i (a scalar tensor from 0) and the values carried from
        step to step (`start` before the first), with the same structure.

    Returns:
      (steps run, whether the last was finite, the carried values after it).
    """

    def keep_going(i, finite, _):
        return tf.logical_and(tf.logical_and(i < num_steps, finite), tf.logical_not(halt))

    def step(i, finite, carried):
        finite, carried = body(i, carried)
        return i + 1, finite, carried

    return tf.while_loop(keep_going, step, (tf.constant(0), tf.constant(True), start))
