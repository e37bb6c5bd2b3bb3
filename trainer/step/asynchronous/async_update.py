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

`AsyncUpdate` holds the pieces: the towers' graphs (`graph`), their threads (`threads`), what a window lands
(`window`) and the staleness gate (`gate`).
"""

from __future__ import annotations

import functools
import time

import tensorflow as tf

from trainer.step.asynchronous import graph
from trainer.step.asynchronous.gate import Gate, TowerFailed
from trainer.step.asynchronous.threads import TowerThreads
from trainer.step.asynchronous.window import Window
from trainer.step.core import micro_batch as mb
from trainer.step.core.calls import CallSize
from trainer.step.stepper import StepResult
from trainer.step.update.apply import BaseUpdate
from trainer.system import graphs
from trainer.system.devices import Placement
from trainer.system.stop import Diverged


class AsyncUpdate(BaseUpdate):
    """The async update mode: `train_steps(n)` lets the towers apply exactly n updates, then returns with
    every tower paused at a step boundary (so a checkpoint or eval sees a consistent snapshot).

    Args:
      task, model, optimizer, placement, global_step, clip_global_norm: as `BaseUpdate` takes them (the clip is
        of each update's gradient).
      iterators: one per tower, each yielding micro-batches of that tower's share of the input.
      max_staleness: bound on staleness (see `trainer.step.asynchronous.gate`); negative for none.
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
        super().__init__(task, model, optimizer, placement, global_step, iterators, clip_global_norm)
        self.examples_per_step = mb.batch_size(self.iterators[0].element_spec)
        with tf.device(placement.host):  # read by the towers' in-graph loops before every update
            self.halt = tf.Variable(False, trainable=False, name="async_halt")
        self.gate = Gate(max_staleness, halt=lambda: self.halt.assign(True))
        micro_batch = mb.micro_batch_fn(task, model, jit_compile)  # called under the tower's device scope
        self.graph = graph.TowerGraph(self, self.halt, micro_batch)
        self.window = Window(task, placement)
        self._make_calls(len(placement.towers))
        self._call_sizes = [CallSize() for _ in placement.towers]
        self.threads = TowerThreads(self.gate, self._tower_calls, self._call_sizes, self.window.land)

    def _make_calls(self, num_towers: int) -> None:
        """The `tf.function`s of the towers' graphs (per tower a compute and a loop of updates, one apply), and
        per tower the call its thread makes for a share of the window's budget ((tickets) -> host values)."""
        self._compute_fns = [graphs.function(functools.partial(self.graph.compute, i)) for i in range(num_towers)]
        self._apply_fn = graphs.function(self.graph.apply)
        self._loop_fns = [graphs.function(functools.partial(self.graph.updates, i)) for i in range(num_towers)]
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
        if not self.threads.threads:
            self.threads.start()
        self.window.open(want_gradients)
        self.gate.open_window(num_steps)
        try:
            self.gate.wait_window(should_stop=should_stop)
        except TowerFailed as e:
            if isinstance(e.__cause__, Diverged):
                raise e.__cause__ from None
            raise
        return self.window.result(num_steps)

    @property
    def steps_finished(self) -> int:
        return self.gate.finished

    @property
    def latest_loss(self) -> float | None:
        return self.window.latest_loss

    @property
    def staleness_all(self) -> list[int]:
        return self.window.staleness_all

    def interrupt(self) -> None:
        """Ends every tower's call after its update in progress (thread-safe; `trainer.system.stop` calls it
        when a stop signal arrives): no update starts after it, in this window or any later one."""
        self.halt.assign(True)

    def close(self) -> None:
        """Stops and joins the tower threads."""
        self.threads.stop()

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
        out = function(tf.constant(len(tickets)), keep_gradients=self.window.keep_gradients)
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
