"""Synchronous updates: one `tf.function` per global step, towers run concurrently inside it.

The global batch is K micro-batches, micro-batch j read from input stream j on the CPU of its tower's task
(`trainer.loop.inputs`); micro-batch j runs on tower j*N//K. The parameter device sums the K results along
a fixed tree (`trainer.step.core.tree`), divides by K, clips, and applies one optimizer update. With
`--deterministic` the result is bitwise the same for every N that divides K, on every split into tasks.

`SyncUpdate` is the host side of a window of steps; the traced step is `trainer.step.sync.step_graph`, its calls
`trainer.step.sync.host_calls`.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from trainer.settings.config import Pipeline
from trainer.step.core import micro_batch as mb
from trainer.step.core import tree
from trainer.step.stepper import StepResult
from trainer.step.sync.host_calls import StepCalls
from trainer.step.sync.runners import make_runner
from trainer.step.sync.step_graph import StepGraph, add_step
from trainer.step.transfers import fused_buffers
from trainer.step.transfers import mirrors as mirrors_lib
from trainer.step.update.apply import BaseUpdate
from trainer.system.devices import Placement, tower_of_micro_batch
from trainer.system.stop import Diverged

NO_PIPELINE = Pipeline()  # one stage: every micro-batch on one tower


class SyncUpdate(BaseUpdate):
    """The sync update mode. `train_steps(n)` runs n global steps and returns their metrics.

    Args:
      task, model, optimizer, placement, global_step, clip_global_norm: as `BaseUpdate` takes them.
      num_micro_batches: K; a multiple of the number of towers.
      iterators: K `trainer.loop.inputs.PlacedIterator`s; iterator j yields micro-batch j of every step.
      jit_compile: XLA-compile each tower's forward and backward pass.
      steps_per_call: steps per `tf.function` call (`trainer.step.core.calls.CallSize`); 0: as many as take ~0.5 s.
      profile_steps: (A, B): steps A+1..B run one per call, each under its own profiler step marker.
      make_optimizer: () -> a new optimizer like `optimizer`, for the replicas of mirrored variables
        (`trainer.step.transfers.mirrors`); None: no variable is mirrored.
      pipeline: `Pipeline` settings: micro-batches through S stages in their schedule's order
        (`trainer.step.pipeline`); 1 stage: each micro-batch on one tower.
      fuse_transfers: what crosses between tasks goes fused (`trainer.step.transfers.fused_buffers`).

    With a `keras.optimizers.LossScaleOptimizer` (fp16), towers differentiate the scaled loss and the optimizer
    unscales, skipping the update and halving the scale when a gradient is not finite.
    """

    def __init__(
        self,
        task,
        model,
        optimizer,
        placement: Placement,
        num_micro_batches: int,
        global_step,
        iterators,
        clip_global_norm: float = 0.0,
        jit_compile: bool = False,
        steps_per_call: int = 0,
        profile_steps: tuple[int, int] | None = None,
        make_optimizer=None,
        pipeline: Pipeline = NO_PIPELINE,
        fuse_transfers: bool = False,
    ):
        if len(iterators) != num_micro_batches:
            raise ValueError(f"{len(iterators)} input streams for {num_micro_batches} micro-batches")
        super().__init__(task, model, optimizer, placement, global_step, iterators, clip_global_norm)
        self.num_micro_batches = num_micro_batches
        self.examples_per_step = sum(mb.batch_size(it.element_spec) for it in iterators)
        layout = (fused_buffers.FusedLayout if fuse_transfers else tree.Layout).of(placement, num_micro_batches)
        self.mirrors = self._make_mirrors(make_optimizer, layout)
        self.runner = make_runner(task, model, placement, layout, num_micro_batches, jit_compile, pipeline)
        with tf.device(placement.host):  # read by the in-graph loop before every step
            self._interrupted = tf.Variable(False, trainable=False, name="interrupted")
        self.graph = StepGraph(self, self.mirrors, self.runner, self._interrupted)
        self.calls = StepCalls(self.graph, self.iterators, global_step, steps_per_call, profile_steps)
        self._latest_loss = None  # the last step's loss (a tensor): read on the host only when asked
        self.last_timings = {}  # the last timed step's seconds per tower (`runner.run`), as host values

    _timing_names = ("tower_step_sec", "event_sec")

    def _make_mirrors(self, make_optimizer, layout) -> mirrors_lib.Mirrors:
        """The mirrored variables' replicas (`trainer.step.transfers.mirrors`); none without `make_optimizer`."""
        mirrored = []
        if make_optimizer is not None:
            variables, spread_over = self.model.trainable_variables, self.placement.spread_over
            loss_scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
            mirrored = mirrors_lib.choose(variables, self.placement.num_tasks, spread_over, loss_scaled)
        return mirrors_lib.Mirrors(self.model, mirrored, layout, make_optimizer, self.optimizer)

    @property
    def _step_fn(self):
        """The one-step `tf.function` (`StepGraph.step`)."""
        return self.calls.step_fn

    def train_steps(self, num_steps: int, want_gradients: bool = False, should_stop=None) -> StepResult:
        """Runs up to `num_steps` updates, fewer when `should_stop()` turns true or `interrupt()` is called.
        Returns how many ran, the steps that traced a graph and their wall time and, when all ran, the mean
        loss, the task's metrics and gradient norm over the steps, the last step's learning rate and per-tower times
        (read on the host once, at the end) and its averaged gradients if asked.

        The steps run in calls of several steps each (an in-graph loop, `steps_per_call`), which stop after the
        step in progress when interrupted; `should_stop` is asked after every call. The window's last step also
        measures tower times; a last step that returns gradients is a call of its own.

        Raises:
          Diverged: a step's loss or gradient was not finite (that update was not applied).
        """
        if self.calls.step_number is None:  # this process's first call: after the restore, if any
            self.mirrors.sync()
        totals, traced, done, last = self.graph.zero_totals(), {"traced_steps": 0, "traced_sec": 0.0}, 0, {}
        in_loop = num_steps - 1 if want_gradients else num_steps
        while done < in_loop:
            ran, totals, last = self._loop_call(in_loop - done, totals, traced, time_last=not want_gradients)
            done += ran
            stopping = (should_stop is not None and should_stop()) or self._interrupted.numpy()
            if stopping and done < num_steps:
                return StepResult(done, **traced)  # a cut window: nothing to report, the run checkpoints next
        if want_gradients:
            last = self.calls.timed(self._step_fn, 1, traced, report=True, want_gradients=True)
            self._raise_if_diverged(last["finite"], last["step"], last["bad_micro_batch"])
            self._latest_loss, totals, done = last["loss"], add_step(totals, last), done + 1
            self.calls.finished += 1
        self.last_timings = {name: _host(last[name]) for name in self._timing_names if name in last}
        return _window_result(done, traced, totals, last)

    def _loop_call(self, remaining: int, totals, traced: dict, time_last: bool):
        """One call of the in-graph loop (`StepCalls.loop_call`); returns how many steps ran, the running sums
        after them and the last step's learning rate and timings."""
        ran, finite, totals, last_loss, step, bad, last = self.calls.loop_call(remaining, totals, traced, time_last)
        self._raise_if_diverged(finite, step, bad)
        self._latest_loss = last_loss
        return ran, totals, last

    @property
    def steps_finished(self) -> int:
        return self.calls.finished

    @property
    def latest_loss(self) -> float | None:
        return None if self._latest_loss is None else float(self._latest_loss)

    def interrupt(self) -> None:
        """Ends the call in progress after its current step (thread-safe; `trainer.system.stop` calls it from its
        watcher thread when a stop signal arrives, while Python handlers wait for the call to return)."""
        self._interrupted.assign(True)

    def _raise_if_diverged(self, finite, step, micro_batch) -> None:
        if bool(finite):
            return
        where = "the gradient"
        if int(micro_batch) >= 0:
            tower = tower_of_micro_batch(int(micro_batch), self.num_micro_batches, len(self.placement.towers))
            where = f"the loss of micro-batch {int(micro_batch)} ({self.placement.describe_tower(tower)})"
        raise Diverged(f"{where} was not finite at step {int(step) + 1}; that update was not applied")

    def close(self) -> None:
        """Nothing to release: the sync mode has no threads."""

    def wrap_micro_batch(self, wrap) -> None:
        """See `Updater.wrap_micro_batch`: the tower runner calls the function when the step traces."""
        self.runner.wrap_micro_batch(wrap)

    def step_graph(self):
        """The traced graph of one step as the in-graph loop runs it (untimed, no gradients returned): what
        `trainer.step.transfers.traffic.count` counts the bytes of, per device (`benchmarks/traffic.py`, the tests)."""
        iterators = [it.iterator for it in self.iterators]
        return self._step_fn.get_concrete_function(iterators, False, False).graph


def _window_result(steps: int, traced: dict, totals, last: dict) -> StepResult:
    """A whole window's `StepResult`: the running sums `totals` of its steps, and its last, timed step's values."""
    return StepResult(
        steps,
        **traced,
        loss=_host(totals[0] / steps),
        metrics=mb.metric_values(totals[1]),
        grad_norm=_host(totals[2] / steps),
        learning_rate=_host(last["learning_rate"]),
        tower_step_sec=_host(last["tower_step_sec"]),
        gradients=last.get("gradients"),
    )


def _host(value):
    """A tensor's value as Python numbers (a float, or a list of floats), as the loop logs it."""
    return np.asarray(value).tolist()
