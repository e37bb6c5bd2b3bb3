"""The host side of the sync step's calls: the step's `tf.function`s, how many steps each call runs
(`trainer.step.core.calls.CallSize`), the profiler's step markers, and which calls traced a graph (their steps are
left out of rates). Every call runs the in-graph loop (`StepGraph.steps`); the one-step function is traced only
for a step that returns its gradients (histograms) and for the step's graph (`SyncUpdate.step_graph`)."""

from __future__ import annotations

import time

import tensorflow as tf

from trainer.step.core.calls import CallSize
from trainer.system import graphs


class StepCalls:
    """Calls of a `StepGraph`'s steps: several in one call, the window's last one timed, or one step alone.

    Args:
      graph: the `trainer.step.sync.step_graph.StepGraph` whose functions the calls run.
      iterators: the K input streams (`trainer.loop.inputs.PlacedIterator`).
      global_step: the int64 `tf.Variable` (read once, after the restore).
      steps_per_call, profile_steps: as `CallSize` takes them.
    """

    def __init__(self, graph, iterators, global_step, steps_per_call: int, profile_steps):
        self.iterators, self.global_step = iterators, global_step
        self.step_fn = graphs.function(graph.step)
        self.loop_fn = graphs.function(graph.steps)
        self.sizes = CallSize(steps_per_call, profile_steps)
        self.step_number = None  # the global step of the profiler's step markers (`--profile_steps`)
        self.finished = 0  # steps finished by this process (`steps_finished`)

    def loop_call(self, remaining: int, totals, traced: dict, time_last: bool):
        """One call of the in-graph loop (at most `remaining` steps; the last of them timed when they are all
        and `time_last`); returns the call's values (`StepGraph.steps`) with the steps run as a host int. The
        sums are carried through every call in step order, so they are the same for any call size."""
        num_steps = self.sizes.size(self.global_step_number(), remaining)
        if self.loop_fn.experimental_get_tracing_count() == 0:
            num_steps = 1  # the call that traces: its steps are left out of rates, so only one
        start, traced_before = time.perf_counter(), traced["traced_steps"]
        report = tf.constant(time_last and num_steps == remaining)
        ran, *out = self.timed(self.loop_fn, num_steps, traced, tf.constant(num_steps, tf.int32), totals, report)
        ran = int(ran)
        self.finished += ran
        if traced["traced_steps"] == traced_before:
            self.sizes.ran(ran, time.perf_counter() - start)
        self.step_number += ran - num_steps  # fewer than asked: interrupted or not finite
        return (ran, *out)

    def timed(self, function, num_steps: int, traced: dict, *args, **kwargs):
        """Calls a step function under the profiler's step marker; a call that traced a graph adds its
        steps and wall time to `traced` (rates leave them out)."""
        tracing_count = function.experimental_get_tracing_count()
        start = time.perf_counter()
        self.step_number = self.global_step_number() + num_steps
        with tf.profiler.experimental.Trace("train", step_num=self.step_number, _r=1):  # the profiler's step
            result = function([it.iterator for it in self.iterators], *args, **kwargs)
        if function.experimental_get_tracing_count() != tracing_count:
            traced["traced_steps"] += num_steps
            traced["traced_sec"] += time.perf_counter() - start
        return result

    def global_step_number(self) -> int:
        """The global step before the next call, tracked on the host (read once, after the restore)."""
        if self.step_number is None:
            self.step_number = int(self.global_step.numpy())
        return self.step_number
