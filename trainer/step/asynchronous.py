"""Asynchronous updates: every tower runs its own loop, in its own thread, on its own share of the input.

A tower reads the current variables from the parameter device, computes the gradient of one micro-batch on
its device, and applies it at once with the optimizer. No averaging, no barrier between towers. The apply
(optimizer update, BatchNorm statistics, global step + 1) is one critical section: the update lands whole
and the step counts it exactly once. Keras's `Variable.assign_add` is a non-atomic read-modify-write that
loses increments when threads race (see the tests), so the step is a raw `tf.Variable` advanced only inside
the critical section. Not deterministic: the order of updates depends on thread timing.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import tensorflow as tf

from trainer.step import spread
from trainer.step import towers as tw
from trainer.step.staleness import Gate, Stopped, TowerFailed
from trainer.step.updater import StepResult, Updater
from trainer.system.devices import Placement
from trainer.system.stop import Diverged


class AsyncUpdate(Updater):
    """The async update mode: `train_steps(n)` lets the towers apply exactly n updates, then returns with
    every tower paused at a step boundary (so a checkpoint or eval sees a consistent snapshot).

    Args:
      model, optimizer, placement, global_step: as for `SyncUpdate`.
      iterators: one per tower, each yielding micro-batches of that tower's share of the input.
      max_staleness: bound on staleness (see `trainer.step.staleness`); negative for none.
      clip_global_norm: clip each update's gradient to this global norm; 0 turns clipping off.
      jit_compile: XLA-compile each tower's forward and backward pass.
    """

    def __init__(
        self,
        model,
        optimizer,
        placement: Placement,
        global_step,
        iterators,
        max_staleness: int = -1,
        clip_global_norm: float = 0.0,
        jit_compile: bool = False,
    ):
        self.model = model
        self.optimizer = optimizer
        self.placement = placement
        self.global_step = global_step
        self.iterators = list(iterators)
        self.clip_global_norm = clip_global_norm
        self.examples_per_step = int(self.iterators[0].element_spec[1].shape[0])
        self.gate = Gate(max_staleness)
        self._seed_flags = [tw.is_seed_state(v) for v in model.non_trainable_variables]
        self._micro_batch = tw.micro_batch_fn(model, jit_compile)
        self._compute_fns = [self._make_compute(i) for i in range(len(placement.towers))]
        self._apply_fn = tf.function(self._apply)
        self._apply_lock = threading.Lock()
        self._records: list[tuple] = []  # (step after apply, loss, correct, staleness, grad norm) of the window
        self._tower_sec = [[] for _ in placement.towers]
        self._last_apply: dict = {}
        self._staleness_all: list[int] = []
        self._latest_loss: float | None = None  # of the last update, for the live progress line
        self._threads: list[threading.Thread] = []

    def train_steps(self, num_steps: int, want_gradients: bool = False, should_stop=None) -> StepResult:
        """Applies exactly `num_steps` updates over all towers, or fewer when `should_stop()` turns true
        (then the updates in flight land and no other starts); returns how many were applied and the
        window's metrics. Tracing is not timed apart (each tower traces in its own thread).

        Raises:
          TowerFailed: a tower raised; names the tower. Every tower is stopped first.
        """
        if not self._threads:
            self._start_threads()
        self._records, self._tower_sec = [], [[] for _ in self.placement.towers]
        self.gate.open_window(num_steps)
        try:
            self.gate.wait_window(should_stop=should_stop)
        except TowerFailed as e:
            if isinstance(e.__cause__, Diverged):
                raise e.__cause__ from None
            raise
        records = sorted(self._records)  # by step: a fixed order for the sums below
        if len(records) < num_steps:
            return StepResult(len(records))  # cut short by a stop request: the run checkpoints and ends
        staleness = [r[3] for r in records]
        self._staleness_all.extend(staleness)
        return StepResult(
            num_steps,
            loss=float(np.mean([r[1] for r in records])),
            accuracy=float(np.sum([r[2] for r in records])) / (num_steps * self.examples_per_step),
            grad_norm=float(np.mean([r[4] for r in records])),
            learning_rate=float(self._last_apply["learning_rate"]),
            tower_step_sec=[float(np.mean(s)) if s else 0.0 for s in self._tower_sec],
            staleness=staleness,
            gradients=self._last_apply["gradients"] if want_gradients else None,
        )

    @property
    def steps_finished(self) -> int:
        return self.gate.finished

    @property
    def latest_loss(self) -> float | None:
        return self._latest_loss

    @property
    def staleness_all(self) -> list[int]:
        return self._staleness_all

    def interrupt(self) -> None:
        """Nothing to do: `train_steps` waits for its window in Python, where a stop signal's handler runs at
        once, and no update starts once `should_stop()` is true."""

    def close(self) -> None:
        """Stops and joins the tower threads."""
        self.gate.stop()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def _start_threads(self) -> None:
        for i in range(len(self.placement.towers)):
            thread = threading.Thread(target=self._tower_loop, args=(i,), name=f"tower-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _tower_loop(self, tower: int) -> None:
        try:
            while True:
                ticket = self.gate.start()
                start = time.perf_counter()
                with tf.profiler.experimental.Trace("train", step_num=ticket, _r=1):  # the profiler's step marker
                    result, read_step = self._compute_fns[tower]()
                self._tower_sec[tower].append(time.perf_counter() - start)
                self.gate.wait_turn(ticket)
                with self._apply_lock:
                    applied = self._apply_fn(result.loss, result.grads, _state_updates(result, self._seed_flags))
                    if not bool(applied["finite"]):
                        raise Diverged(
                            f"the loss or gradient of {self.placement.describe_tower(tower)} was not finite at step "
                            f"{int(applied['step']) + 1}; that update was not applied"
                        )
                    self._last_apply = applied
                    staleness = int(applied["step"]) - int(read_step) - 1
                    record = (int(applied["step"]), float(result.loss), int(result.correct), staleness)
                    self._records.append((*record, float(applied["grad_norm"])))
                    self._latest_loss = record[1]
                self.gate.finish(ticket)
        except Stopped:
            return
        except BaseException as e:  # noqa: BLE001 (any tower error must end the run, never hang it)
            self.gate.fail(tower, e)

    def _make_compute(self, tower: int):
        device = self.placement.towers[tower]
        iterator = self.iterators[tower]
        num_towers = len(self.placement.towers)

        @tf.function
        def compute():
            with tf.device(iterator.device):  # the CPU of the tower's own task
                features, labels = iterator.take(iterator.iterator)
            with tf.device(self.placement.parameter_device):
                step = self.global_step.read_value()
                loss_scale = tw.loss_scale(self.optimizer)
            trainable = spread.read_values(self.model.trainable_variables)
            non_trainable = spread.read_values(self.model.non_trainable_variables)
            with tf.device(device):
                state = tw.micro_batch_seeds(non_trainable, self._seed_flags, step, tower, num_towers)
                result = self._micro_batch(trainable, state, features, labels, loss_scale)
            return result.loss, result.correct, result.grads, result.non_trainable, step

        def run():
            loss, correct, grads, non_trainable, step = compute()
            return tw.MicroBatchResult(loss, correct, grads, non_trainable), step

        return run

    def _apply(self, loss, grads, new_state):
        with tf.device(self.placement.parameter_device):
            loss_scale = tw.loss_scale(self.optimizer)
            return tw.apply_update(
                self.model, self.optimizer, self.global_step, loss, grads, new_state, loss_scale, self.clip_global_norm
            )


def _state_updates(result: tw.MicroBatchResult, seed_flags: list[bool]) -> list:
    """The micro-batch's new non-trainable values, None for seed states (a function of the step)."""
    return [None if flag else value for value, flag in zip(result.non_trainable, seed_flags, strict=True)]
