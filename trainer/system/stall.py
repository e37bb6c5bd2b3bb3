"""The chief's heartbeat of progress: a run of several tasks whose steps stop finishing ends, named, with 75.

`trainer.system.peers` sees a peer whose process is gone, frozen or cut off: its server stops answering. It
cannot see a task whose server answers while its devices never finish their work (a hung GPU driver or
kernel, a collective waiting forever): the chief's step then waits without end. `StallWatch` measures
progress itself: the update mode's count of finished steps (`Updater.steps_finished`, a host counter),
sampled once a second while the loop trains. No step finished for the stall limit ends the attempt with 75
(`peers.end_attempt`), naming what it knows; the job requeues and resumes from the last checkpoint.

The stall limit is `max(--peer_timeout_sec, TRACE_ALLOWANCE x the longest wait between two finished steps
seen in this process)`. The first window of a start (one step: graph tracing and, with XLA, compiling) is
measured but not judged: it sets the longest wait, so that a later graph's tracing (the step that returns
gradients for histograms: a graph of the same size) fits in the limit. Evaluation and
checkpoints run between windows, where the watch does not judge either.
"""

from __future__ import annotations

import contextlib
import threading
import time

from trainer.system import peers

SAMPLE_EVERY_SEC = 1.0
TRACE_ALLOWANCE = 3.0  # a later graph's tracing, against the first step's (tracing + first run)


class StallWatch(peers.Watch):
    """Samples `finished()` from a thread while a window of steps runs (`window`).

    Args:
      finished: returns the number of steps finished so far (any thread).
      timeout_sec: the shortest stall that ends the attempt (--peer_timeout_sec).
      what: names what is stuck in the message, e.g. "worker tasks 1 and 2 (node2:12000, ...)".
      on_lost: called with the message before the exit (to record the attempt's end).
      silent: returns the peers not answering now (`peers.PeerWatch.silent`): a stall then waits for that
        watch, which names the silent peer, instead of blaming every task.
      end: ends the process with the message (`peers.end_attempt`; tests pass another).
    """

    def __init__(
        self, finished, timeout_sec: float, what: str, on_lost=None, silent=list, end=peers.end_attempt, every=None
    ):
        self.finished, self.timeout_sec, self.what, self.silent = finished, timeout_sec, what, silent
        self.on_lost = on_lost or (lambda message: None)
        self.end = end
        self.every = SAMPLE_EVERY_SEC if every is None else every
        self.longest_wait = 0.0  # between two finished steps (or a window's start and its first step)
        self._lock = threading.Lock()
        self._window: tuple[int, float, bool] | None = None  # (count, when it last changed, judged)
        super().__init__("towerflow-stall-watch")

    @property
    def limit_sec(self) -> float:
        return max(self.timeout_sec, TRACE_ALLOWANCE * self.longest_wait)

    @contextlib.contextmanager
    def window(self, judged: bool = True):
        """Watches the steps run inside; `judged=False` (the first window of a start) only measures them."""
        with self._lock:
            self._window = (self.finished(), time.monotonic(), judged)
        try:
            yield
        finally:
            with self._lock:
                self._sample(time.monotonic())
                self._window = None

    def _run(self) -> None:
        while not self._stopped.wait(self.every):
            with self._lock:
                stalled = self._sample(time.monotonic())
            if stalled is not None and not self.silent():
                self.end(self._message(stalled), self.on_lost)
                return

    def _sample(self, now: float) -> float | None:
        """Updates the window's count; returns how long it has waited when that is past the limit and judged."""
        if self._window is None:
            return None
        count, since, judged = self._window
        current = self.finished()
        if current != count:
            self.longest_wait = max(self.longest_wait, now - since)
            self._window = (current, now, judged)
            return None
        waited = now - since
        return waited if judged and waited > self.limit_sec else None

    def _message(self, waited: float) -> str:
        return (
            f"no training step finished for {waited:.0f} s (the limit: --peer_timeout_sec={self.timeout_sec:g}, or "
            f"{TRACE_ALLOWANCE:g} x the longest wait for a step so far, {self.longest_wait:.1f} s), though every "
            f"task's server answers: a device of {self.what} is stuck (a hung driver or kernel) or its work never ends"
        )
