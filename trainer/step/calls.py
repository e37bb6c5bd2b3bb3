"""How many steps one `tf.function` call of the sync mode runs (`--steps_per_call`).

A call per step costs a Python round trip per step (the call, its argument handling, reading results): on a
20 ms step that is ~5% (`tower1_vs_plain` in benchmarks/RESULTS.md). Several steps per call, in an in-graph
loop, pay it once per call, as Keras's `steps_per_execution` and orbit's `steps_per_loop` do. The result is
the same bits for every call size (`trainer.step.sync` carries the metric sums through the calls), so the size is
free to follow the measured step time.
"""

from __future__ import annotations

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
