"""What the async towers land in one window (`AsyncUpdate.train_steps`): each update's record, each tower's seconds
per update, the latest update's learning rate and gradients; and the window's `StepResult` from them."""

from __future__ import annotations

import threading

import numpy as np

from trainer.step.asynchronous import graph
from trainer.step.core import micro_batch as mb
from trainer.step.stepper import StepResult
from trainer.system.stop import Diverged


class Window:
    """The records of the window in progress, landed from every tower's thread (`land`), and what outlives it:
    the staleness of every update of this process and the latest loss.

    Args:
      task: the run's task (its metric names).
      placement: the towers (their number, and how a diverged one is named).
    """

    def __init__(self, task, placement):
        self.task, self.placement = task, placement
        self._lock = threading.Lock()
        self.staleness_all: list[int] = []
        self.latest_loss: float | None = None  # of the last update, for the live progress line
        self.open(want_gradients=False)

    def open(self, want_gradients: bool) -> None:
        """Starts a window: no records yet; `keep_gradients` asks the towers' calls for their gradients."""
        self.records: list[tuple] = []  # each update's record of the window (`graph.record_dtypes`)
        self.tower_sec = [[] for _ in self.placement.towers]
        self.keep_gradients = want_gradients
        self.last = (-1, None, None)  # (step, learning rate, gradients) of the window's latest update

    def land(self, tower: int, out: dict, seconds: float) -> int:
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
        with self._lock:
            self.records.extend(zip(*records, strict=True))
            self.tower_sec[tower].append(seconds / count)
            self.latest_loss = records[1][-1]
            if records[0][-1] > self.last[0]:
                self.last = (records[0][-1], out["learning_rate"], out.get("gradients"))
        return count

    def result(self, num_steps: int) -> StepResult:
        """The window's `StepResult`: its metrics when all `num_steps` updates landed, else only their count."""
        records = sorted(self.records)  # by step: a fixed order for the sums below
        if len(records) < num_steps:
            return StepResult(len(records))  # cut short by a stop request: the run checkpoints and ends
        staleness = [r[2] for r in records]
        self.staleness_all.extend(staleness)
        return StepResult(
            num_steps,
            loss=float(np.mean([r[1] for r in records])),
            metrics=self._metrics(records),
            grad_norm=float(np.mean([r[3] for r in records])),
            learning_rate=float(self.last[1]),
            tower_step_sec=[float(np.mean(s)) if s else 0.0 for s in self.tower_sec],
            staleness=staleness,
            gradients=self.last[2] if self.keep_gradients else None,
        )

    def _metrics(self, records: list[tuple]) -> dict:
        """The task's metrics over the window's updates: each metric's sums over its counts."""
        names, first = self.task.metric_names, len(graph.RECORD_DTYPES)
        sums = np.sum([r[first:] for r in records], axis=0) if names else []
        return mb.metric_values({n: (sums[i], sums[len(names) + i]) for i, n in enumerate(names)})
