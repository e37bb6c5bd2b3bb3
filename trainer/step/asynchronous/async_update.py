"""Asynchronous updates: every tower runs its own loop, in its own thread, on its own share of the input.

A tower reads the current variables from the parameter device, computes the gradient of one micro-batch on
its device, and applies it at once with the optimizer. No averaging, no barrier between towers. The apply
(optimizer update, BatchNorm statistics, global step + 1) is one critical section, a mutex in the graph
(`trainer.step.asynchronous.graph`): the update lands whole and the step counts it exactly once. Keras's
`Variable.assign_add` is a non-atomic read-modify-write that loses increments when threads race (see the
tests), so the step is a raw `tf.Variable` advanced only inside the critical section. Not deterministic: the
order of updates depends on thread timing.

Without a staleness bound a tower runs several updates per `tf.function` call (an in-graph loop, as sync runs
several steps per call) and reads their results on the host once per call. With `--max_staleness` the gate
orders every update (`trainer.step.asynchronous.gate`), so a tower makes one call to compute and one to apply.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import tensorflow as tf

from trainer.step.asynchronous import graph
from trainer.step.asynchronous.gate import Gate, Stopped, TowerFailed
from trainer.step.core import micro_batch as mb
from trainer.step.core.calls import MAX_AUTO_STEPS, CallSize
from trainer.step.stepper import StepResult, Updater
from trainer.system.devices import Placement
from trainer.system.stop import Diverged


class AsyncUpdate(Updater):
    """The async update mode: `train_steps(n)` lets the towers apply exactly n updates, then returns with
    every tower paused at a step boundary (so a checkpoint or eval sees a consistent snapshot).

    Args:
      task, model, optimizer, placement, global_step: as for `SyncUpdate`.
      iterators: one per tower, each yielding micro-batches of that tower's share of the input.
      max_staleness: bound on staleness (see `trainer.step.asynchronous.gate`); negative for none.
      clip_global_norm: clip each update's gradient to this global norm; 0 turns clipping off.
      jit_compile: XLA-compile each tower's forward and backward pass.
    """

    def __init__(
        self,
        task,
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
        self.task = task
        self.examples_per_step = mb.batch_size(self.iterators[0].element_spec)
        with tf.device(placement.host):  # read by the towers' in-graph loops before every update
            self.halt = tf.Variable(False, trainable=False, name="async_halt")
        self.gate = Gate(max_staleness, halt=lambda: self.halt.assign(True))
        self.graph = graph.TowerGraph(
            task,
            model,
            optimizer,
            placement,
            global_step,
            self.iterators,
            self.halt,
            clip_global_norm,
            mb.micro_batch_fn(task, model, jit_compile),  # called under the tower's device scope
        )
        self._make_calls(len(placement.towers))
        self._call_sizes = [CallSize() for _ in placement.towers]
        self._land_lock = threading.Lock()
        self._records: list[tuple] = []  # each update's record of the window (`graph.record_dtypes`)
        self._tower_sec = [[] for _ in placement.towers]
        self._last = (-1, None, None)  # (step, learning rate, gradients) of the window's latest update
        self._keep_gradients = False
        self._staleness_all: list[int] = []
        self._latest_loss: float | None = None  # of the last update, for the live progress line
        self._threads: list[threading.Thread] = []

    def _make_calls(self, num_towers: int) -> None:
        """The `tf.function`s of the towers' graphs (per tower a compute and a loop of updates, one apply), and
        per tower the call its thread makes for a share of the window's budget ((tickets) -> host values)."""
        self._compute_fns = [tf.function(functools.partial(self.graph.compute, i)) for i in range(num_towers)]
        self._apply_fn = tf.function(self.graph.apply)
        self._loop_fns = [tf.function(functools.partial(self.graph.updates, i)) for i in range(num_towers)]
        update = self._ordered_update if self.gate.ordered else self.chained_updates
        self._tower_calls = [functools.partial(update, i) for i in range(num_towers)]

    def train_steps(self, num_steps: int, want_gradients: bool = False, should_stop=None) -> StepResult:
        """Applies exactly `num_steps` updates over all towers, or fewer when `should_stop()` turns true or
        `interrupt()` is called (then each tower's update in progress lands and no other starts); returns how
        many were applied and the window's metrics. Tracing is not timed apart (each tower traces in its own
        thread).

        Raises:
          TowerFailed: a tower raised; names the tower. Every tower is stopped first.
        """
        if not self._threads:
            self._start_threads()
        self._records, self._tower_sec = [], [[] for _ in self.placement.towers]
        self._keep_gradients, self._last = want_gradients, (-1, None, None)
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
        staleness = [r[2] for r in records]
        self._staleness_all.extend(staleness)
        return StepResult(
            num_steps,
            loss=float(np.mean([r[1] for r in records])),
            metrics=self._metrics(records),
            grad_norm=float(np.mean([r[3] for r in records])),
            learning_rate=float(self._last[1]),
            tower_step_sec=[float(np.mean(s)) if s else 0.0 for s in self._tower_sec],
            staleness=staleness,
            gradients=self._last[2] if want_gradients else None,
        )

    def _metrics(self, records: list[tuple]) -> dict:
        """The task's metrics over the window's updates: each metric's sums over its counts."""
        names, first = self.task.metric_names, len(graph.RECORD_DTYPES)
        sums = np.sum([r[first:] for r in records], axis=0) if names else []
        return mb.metric_values({n: (sums[i], sums[len(names) + i]) for i, n in enumerate(names)})

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
        """Ends every tower's call after its update in progress (thread-safe; `trainer.system.stop` calls it
        when a stop signal arrives): no update starts after it, in this window or any later one."""
        self.halt.assign(True)

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
        parts = 2 * len(self.placement.towers)  # the window's budget is taken in shrinking shares
        try:
            while True:
                tickets = self.gate.start_many(self._call_sizes[tower].size(0, MAX_AUTO_STEPS), parts)
                start = time.perf_counter()
                with tf.profiler.experimental.Trace("train", step_num=tickets[-1], _r=1):  # the profiler's step
                    out = self._tower_calls[tower](tickets)
                applied = self._land(tower, out, time.perf_counter() - start)
                self.gate.finish_many(tickets, applied)
        except Stopped:
            return
        except BaseException as e:  # noqa: BLE001 (any tower error must end the run, never hang it)
            self.gate.fail(tower, e)

    def wrap_micro_batch(self, wrap) -> None:
        """See `Updater.wrap_micro_batch`: every tower's graph reads `self.graph.micro_batch` when it traces."""
        self.graph.micro_batch = wrap(self.graph.micro_batch)

    def compute_call(self, tower: int):
        """One call: `tower`'s gradient of its next micro-batch (`TowerGraph.compute`'s values), not applied."""
        return self._compute_fns[tower]()

    def apply_call(self, loss, grads, non_trainable, read_step) -> dict:
        """One call: applies `compute_call`'s values in the critical section (`TowerGraph.apply`)."""
        return self._apply_fn(loss, grads, non_trainable, read_step)

    def chained_updates(self, tower: int, tickets: list[int]) -> dict:
        """Without a staleness bound: `len(tickets)` updates of `tower` in one call (fewer when halted),
        computed and applied in an in-graph loop; returns the call's values with "count" a host int."""
        function, sizes = self._loop_fns[tower], self._call_sizes[tower]
        tracing_count, start = function.experimental_get_tracing_count(), time.perf_counter()
        out = function(tf.constant(len(tickets)), keep_gradients=self._keep_gradients)
        count = int(out["count"])  # waits for the call
        if function.experimental_get_tracing_count() == tracing_count:
            sizes.ran(count, time.perf_counter() - start)
        return {**out, "count": count}

    def _ordered_update(self, tower: int, tickets: list[int]) -> dict:
        """With a staleness bound: one update, applied in the order the gate gives (its one ticket)."""
        loss, metrics, grads, non_trainable, read_step = self.compute_call(tower)
        self.gate.wait_turn(tickets[0])
        m = self.apply_call(loss, grads, non_trainable, read_step)
        records = [tf.reshape(v, [1]) for v in graph.record_values(m, loss, metrics)]
        return {"count": 1, "records": records, **{k: m[k] for k in ("finite", "learning_rate", "gradients")}}

    def _land(self, tower: int, out: dict, seconds: float) -> int:
        """Reads a call's results on the host (once per call) and keeps its records; returns how many updates
        it applied.

        Raises:
          Diverged: its last update was not finite (and was not applied).
        """
        count = out["count"]
        records = [r.numpy().tolist() for r in out["records"]]
        if not bool(out["finite"]):
            raise Diverged(
                f"the loss or gradient of {self.placement.describe_tower(tower)} was not finite at step "
                f"{records[0][count - 1] + 1}; that update was not applied"
            )
        if count == 0:
            return 0
        with self._land_lock:
            self._records.extend(zip(*records, strict=True))
            self._tower_sec[tower].append(seconds / count)
            self._latest_loss = records[1][-1]
            if records[0][-1] > self._last[0]:
                self._last = (records[0][-1], out["learning_rate"], out.get("gradients"))
        return count
