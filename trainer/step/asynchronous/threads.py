"""The async towers' threads: one per tower, each taking shares of the window's budget from the staleness gate
(`trainer.step.asynchronous.gate`), making its tower's calls and landing their results, until the gate stops
it. A tower that raises fails the gate, which ends the window with its error: never a hang."""

from __future__ import annotations

import threading
import time

import tensorflow as tf

from trainer.step.asynchronous.gate import Stopped
from trainer.step.core.calls import MAX_AUTO_STEPS


class TowerThreads:
    """The towers' threads.

    Args:
      gate: the run's `Gate`.
      tower_calls: per tower, (tickets) -> the call's values; read at every call, so a replaced entry counts.
      call_sizes: per tower, its `trainer.step.core.calls.CallSize`.
      land: (tower, the call's values, seconds) -> updates applied (`Window.land`).
    """

    def __init__(self, gate, tower_calls: list, call_sizes: list, land):
        self.gate, self.tower_calls, self.call_sizes, self.land = gate, tower_calls, call_sizes, land
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(len(self.tower_calls)):
            thread = threading.Thread(target=self._loop, args=(i,), name=f"tower-{i}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def stop(self) -> None:
        """Stops and joins the threads."""
        self.gate.stop()
        for thread in self.threads:
            thread.join()
        self.threads = []

    def _loop(self, tower: int) -> None:
        parts = 2 * len(self.tower_calls)  # the window's budget is taken in shrinking shares
        try:
            while True:
                tickets = self.gate.start_many(self.call_sizes[tower].size(0, MAX_AUTO_STEPS), parts)
                start = time.perf_counter()
                with tf.profiler.experimental.Trace("train", step_num=tickets[-1], _r=1):  # the profiler's step
                    out = self.tower_calls[tower](tickets)
                applied = self.land(tower, out, time.perf_counter() - start)
                self.gate.finish_many(tickets, applied)
        except Stopped:
            return
        except BaseException as e:  # noqa: BLE001 (any tower error must end the run, never hang it)
            self.gate.fail(tower, e)
