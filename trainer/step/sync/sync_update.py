"""Synchronous updates: one `tf.function` per global step, towers run concurrently inside it.

The global batch is K micro-batches, micro-batch j read from input stream j on the CPU of its tower's task
(`trainer.loop.inputs`); micro-batch j runs on tower j*N//K. The parameter device sums the K results along
a fixed tree (`trainer.step.core.tree`), divides by K, clips, and applies one optimizer update. With
`--deterministic` the result is bitwise the same for every N that divides K, on every split into tasks.
"""

from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf

from trainer.settings.config import Pipeline
from trainer.step.core import micro_batch as mb
from trainer.step.core import tree
from trainer.step.core.calls import CallSize, in_graph_loop
from trainer.step.core.combine import combine
from trainer.step.stepper import StepResult, Updater
from trainer.step.sync.runners import make_runner
from trainer.step.transfers import fused_buffers, spread
from trainer.step.transfers import mirrors as mirrors_lib
from trainer.system.devices import Placement, tower_of_micro_batch
from trainer.system.stop import Diverged

NO_PIPELINE = Pipeline()  # one stage: every micro-batch on one tower


class SyncUpdate(Updater):
    """The sync update mode. `train_steps(n)` runs n global steps and returns their metrics.

    Args:
      task: the run's `tasks.Task` (its loss and metrics).
      model: the task's Keras model whose variables live on `placement.parameter_device` or, spread, each
        on its owner (`trainer.step.transfers.spread`).
      optimizer: built Keras optimizer (slots on the parameter device).
      placement: tower and parameter devices.
      num_micro_batches: K; a multiple of the number of towers.
      global_step: int64 `tf.Variable` on the parameter device; +1 per update.
      iterators: K `trainer.loop.inputs.PlacedIterator`s; iterator j yields micro-batch j of every step.
      clip_global_norm: clip the averaged gradient to this global norm; 0 turns clipping off.
      jit_compile: XLA-compile each tower's forward and backward pass.
      steps_per_call: steps per `tf.function` call (`trainer.step.core.calls.CallSize`); 0: as many as take ~0.5 s.
      profile_steps: (A, B): steps A+1..B run one per call, each under its own profiler step marker.
      make_optimizer: () -> a new optimizer like `optimizer`, for the replicas of mirrored variables
        (`trainer.step.transfers.mirrors`); None: no variable is mirrored.
      pipeline: `Pipeline` settings: micro-batches through S stages in their schedule's order
        (`trainer.step.pipeline.runner`); 1 stage: each micro-batch on one tower.

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
        self.task = task
        self.model = model
        self.optimizer = optimizer
        self.placement = placement
        self.num_micro_batches = num_micro_batches
        self.global_step = global_step
        if len(iterators) != num_micro_batches:
            raise ValueError(f"{len(iterators)} input streams for {num_micro_batches} micro-batches")
        self.iterators = list(iterators)
        self.clip_global_norm = clip_global_norm
        self.examples_per_step = sum(mb.batch_size(it.element_spec) for it in iterators)
        self._seed_flags = [mb.is_seed_state(v) for v in model.non_trainable_variables]
        self._owners = (
            [spread.device_of(v) for v in model.trainable_variables],
            [spread.device_of(v) for v in model.non_trainable_variables],
            placement.parameter_device,
        )
        self._layout = (fused_buffers.FusedLayout if fuse_transfers else tree.Layout).of(placement, num_micro_batches)
        self.mirrors = self._make_mirrors(make_optimizer)
        self.runner = make_runner(task, model, placement.towers, self._layout, num_micro_batches, jit_compile, pipeline)
        self._step_fn = tf.function(self._step)
        self._lean_fn = tf.function(self._lean_steps)
        self._calls = CallSize(steps_per_call, profile_steps)
        with tf.device(placement.host):  # read by the in-graph loop before every step
            self._interrupted = tf.Variable(False, trainable=False, name="interrupted")
        self._latest_loss = None  # the last step's loss (a tensor): read on the host only when asked
        self._step_number = None  # the global step of the profiler's step markers (`--profile_steps`)
        self._finished = 0  # steps finished by this process (`steps_finished`)
        self.last_timings = {}  # the last timed step's seconds per tower (`runner.run`), as host values

    _timing_names = ("tower_step_sec", "event_sec")

    def _make_mirrors(self, make_optimizer) -> mirrors_lib.Mirrors:
        """The mirrored variables' replicas (`trainer.step.transfers.mirrors`); none without `make_optimizer`."""
        mirrored = []
        if make_optimizer is not None:
            variables, spread_over = self.model.trainable_variables, self.placement.spread_over
            loss_scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
            mirrored = mirrors_lib.choose(variables, self.placement.num_tasks, spread_over, loss_scaled)
        return mirrors_lib.Mirrors(self.model, mirrored, self._layout, make_optimizer, self.optimizer)

    def train_steps(self, num_steps: int, want_gradients: bool = False, should_stop=None) -> StepResult:
        """Runs up to `num_steps` updates, fewer when `should_stop()` turns true or `interrupt()` is called.
        Returns how many ran, the steps that traced a graph and their wall time and, when all ran, the mean
        loss, the task's metrics and gradient norm over the steps, the last step's learning rate and per-tower times
        (read on the host once, at the end) and its averaged gradients if asked.

        The first n-1 steps run in calls of several steps each (an in-graph loop, `steps_per_call`), which
        stop after the step in progress when interrupted; `should_stop` is asked after every call. The last
        step is a call of its own that also measures tower times (and returns gradients).

        Raises:
          Diverged: a step's loss or gradient was not finite (that update was not applied).
        """
        if self._step_number is None:  # this process's first call: after the restore, if any
            self.mirrors.sync()
        totals, traced, done = self._zero_totals(), {"traced_steps": 0, "traced_sec": 0.0}, 0
        while done < num_steps - 1:
            ran, totals = self._lean_call(num_steps - 1 - done, totals, traced)
            done += ran
            if (should_stop is not None and should_stop()) or self._interrupted.numpy():
                return StepResult(done, **traced)  # a cut window: nothing to report, the run checkpoints next
        metrics = self._timed(self._step_fn, 1, traced, report=True, want_gradients=want_gradients)
        self._raise_if_diverged(metrics["finite"], metrics["step"], metrics["bad_micro_batch"])
        self._latest_loss = metrics["loss"]
        self.last_timings = {name: _host(metrics[name]) for name in self._timing_names if name in metrics}
        self._finished += 1
        steps = done + 1
        return StepResult(
            steps,
            **traced,
            loss=_host((totals[0] + metrics["loss"]) / steps),
            metrics=mb.metric_values(mb.add_metrics(totals[1], metrics["metrics"])),
            grad_norm=_host((totals[2] + metrics["grad_norm"]) / steps),
            learning_rate=_host(metrics["learning_rate"]),
            tower_step_sec=_host(metrics["tower_step_sec"]),
            gradients=metrics.get("gradients"),
        )

    @property
    def steps_finished(self) -> int:
        return self._finished

    @property
    def latest_loss(self) -> float | None:
        return None if self._latest_loss is None else float(self._latest_loss)

    def interrupt(self) -> None:
        """Ends the call in progress after its current step (thread-safe; `trainer.system.stop` calls it from its
        watcher thread when a stop signal arrives, while Python handlers wait for the call to return)."""
        self._interrupted.assign(True)

    def _zero_totals(self):
        return (tf.constant(0.0), mb.zero_metrics(self.task), tf.constant(0.0))

    def _lean_call(self, remaining: int, totals, traced: dict):
        """One call of lean steps (at most `remaining`); returns how many ran and the running sums after
        them. The sums are carried through every call in step order, so they are the same for any call size."""
        num_steps = self._calls.size(self._global_step_number(), remaining)
        if self._lean_fn.experimental_get_tracing_count() == 0:
            num_steps = 1  # the call that traces: its steps are left out of rates, so only one
        start, traced_before = time.perf_counter(), traced["traced_steps"]
        out = self._timed(self._lean_fn, num_steps, traced, tf.constant(num_steps, tf.int32), totals)
        ran, finite, totals, last_loss, step, bad = out
        ran = int(ran)
        self._finished += ran
        if traced["traced_steps"] == traced_before:
            self._calls.ran(ran, time.perf_counter() - start)
        self._step_number += ran - num_steps  # fewer than asked: interrupted or not finite
        self._raise_if_diverged(finite, step, bad)
        self._latest_loss = last_loss
        return ran, totals

    def _timed(self, function, num_steps: int, traced: dict, *args, **kwargs):
        """Calls a step function under the profiler's step marker; a call that traced a graph adds its
        steps and wall time to `traced` (rates leave them out)."""
        tracing_count = function.experimental_get_tracing_count()
        start = time.perf_counter()
        self._step_number = self._global_step_number() + num_steps
        with tf.profiler.experimental.Trace("train", step_num=self._step_number, _r=1):  # the profiler's step
            result = function([it.iterator for it in self.iterators], *args, **kwargs)
        if function.experimental_get_tracing_count() != tracing_count:
            traced["traced_steps"] += num_steps
            traced["traced_sec"] += time.perf_counter() - start
        return result

    def _global_step_number(self) -> int:
        """The global step before the next call, tracked on the host (read once, after the restore)."""
        if self._step_number is None:
            self._step_number = int(self.global_step.numpy())
        return self._step_number

    def _lean_steps(self, iterators, num_steps, totals):
        """Up to `num_steps` steps in one graph (`trainer.step.core.calls.in_graph_loop`): ends early at a step that
        was not finite (its update not applied) or once interrupted. Returns (steps run, finite, sums, last
        loss, step, bad micro-batch)."""

        def one_step(_, carried):
            totals = carried[0]
            m = self._step(iterators, report=False, want_gradients=False)
            totals = (totals[0] + m["loss"], mb.add_metrics(totals[1], m["metrics"]), totals[2] + m["grad_norm"])
            return m["finite"], (totals, m["loss"], m["step"], m["bad_micro_batch"])

        start = (totals, tf.constant(0.0), self.global_step.read_value(), -1)
        ran, finite, (totals, last_loss, step, bad) = in_graph_loop(one_step, num_steps, self._interrupted, start)
        return ran, finite, totals, last_loss, step, bad

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
        """The traced graph of one step as the lean calls run it (no tower times, no gradients returned): what
        `trainer.step.transfers.traffic.count` counts the bytes of, per device (`benchmarks/traffic.py`, the tests)."""
        iterators = [it.iterator for it in self.iterators]
        return self._step_fn.get_concrete_function(iterators, False, False).graph

    def _step(self, iterators, report: bool, want_gradients: bool):
        placement = self.placement
        batches = []
        for placed, iterator in zip(self.iterators, iterators, strict=True):
            with tf.device(placed.device):  # the CPU of the task whose tower runs this micro-batch
                batches.append(placed.take(iterator))
        with tf.device(placement.parameter_device):
            step = self.global_step.read_value()
            loss_scale = mb.loss_scale(self.optimizer)
        # Per task, one copy of every value, which its towers share (`trainer.step.core.tree.Layout.fanout`); one
        # fanout of all the variables, so a fused one sends them together.
        n = len(self.model.trainable_variables)
        values = spread.read_values(self.model.trainable_variables + self.model.non_trainable_variables)
        copies = self.mirrors.fanout(values, self._owners[0] + self._owners[1])
        trainable, non_trainable = [c[:n] for c in copies], [c[n:] for c in copies]
        results, timings = self.runner.run(batches, trainable, non_trainable, step, report, loss_scale)
        with tf.device(placement.parameter_device):
            metrics = self._apply(results, loss_scale, non_trainable)
        metrics.update(timings)
        if not want_gradients:
            metrics.pop("gradients")
        return metrics

    def _apply(self, results, loss_scale, old_state):
        loss, metrics, grads, new_state, replica_grads = combine(
            results, self._seed_flags, old_state, self._owners, self.mirrors
        )
        applied = mb.apply_update(
            self.model,
            self.optimizer,
            self.global_step,
            loss,
            grads,
            new_state,
            loss_scale,
            self.clip_global_norm,
            also=lambda clip: self.mirrors.apply(replica_grads, clip),
        )
        bad = mb.first_non_finite([r.loss for r in results])
        return {"loss": loss, "metrics": metrics, "bad_micro_batch": bad, **applied}


def _host(value):
    """A tensor's value as Python numbers (a float, or a list of floats), as the loop logs it."""
    return np.asarray(value).tolist()
