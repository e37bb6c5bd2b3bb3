"""Coordination of asynchronous towers: the step budget of a window, pauses at step boundaries, stop on
error, and the `--max_staleness` bound. Pure Python (threading), so it is testable without TensorFlow.

Staleness of an update = number of other updates applied between the read of the variables it was computed
from and its own apply (= global step after apply - global step at read - 1).

Bounding it to S without deadlock takes two rules, both only when S >= 0:
  1. a tower may start (read the variables) only while at most S other towers are in flight;
  2. updates are applied in the order their towers started.
Then the updates applied between a tower's read and its apply are those of towers that started before it and
were still in flight, at most S of them. The oldest tower in flight can always apply, so no tower waits
forever. S = 0 is lock-step: one tower at a time. S < 0 (the default) bounds nothing and orders nothing.

Without a bound a tower may take several updates at once (one call of several updates, `start_many`): a
share of the window's budget that shrinks as it is used up (ceil(budget / parts)), so the last updates of a
window are handed out one by one and no tower idles long behind another's share at the window's end.
"""

from __future__ import annotations

import collections
import threading


class TowerFailed(RuntimeError):
    """A tower raised; the message names the tower, the original error is the cause."""


class Stopped(Exception):
    """Raised in a tower thread when the run is shutting down."""


class Gate:
    """Hands out the updates of a window to towers, and enforces the staleness bound.

    Args:
      max_staleness: S; negative for unbounded.
      halt: called (under the gate's lock) when no update may start any more (a stop request, a failed
        tower, shutdown), to end the towers' calls in progress after their current update.
    """

    def __init__(self, max_staleness: int = -1, halt=lambda: None):
        self.max_staleness = max_staleness
        self._halt = halt
        self._cond = threading.Condition()
        self._budget = 0  # updates that may still start in this window
        self._unfinished = 0  # started, or allowed to start, but not yet finished, in this window
        self._in_flight = collections.deque()  # tickets of started, unapplied updates, in start order
        self._next_ticket = 0
        self.finished = 0  # updates applied since the start (read by the stall watch, any thread)
        self._stopping = False
        self._error: BaseException | None = None
        self._should_stop = lambda: False  # the window's stop request: no update starts once it is true

    def open_window(self, num_updates: int) -> None:
        """Lets `num_updates` more updates start."""
        with self._cond:
            self._budget += num_updates
            self._unfinished += num_updates
            self._cond.notify_all()

    def wait_window(self, poll_sec: float = 0.1, should_stop=None) -> None:
        """Blocks until every update of the window has been applied (all towers then idle at a step
        boundary). When `should_stop()` turns true, the updates not yet started are dropped from the window
        and only those in flight are waited for. Raises TowerFailed if a tower raised."""
        with self._cond:
            self._should_stop = should_stop or (lambda: False)
            halted = False
            while self._unfinished > 0 and self._error is None:
                if not halted and self._should_stop():
                    self._unfinished -= self._budget  # never started: the window ends at the next boundary
                    self._budget, halted = 0, True
                    self._halt()  # and the calls in progress end after their current update
                    continue
                self._cond.wait(poll_sec)  # a timeout keeps the main thread responsive to signals
            if self._error is not None:
                raise self._error

    @property
    def ordered(self) -> bool:
        """Whether updates are bounded and applied in start order (`wait_turn` waits), one per start."""
        return self.max_staleness >= 0

    def start(self) -> int:
        """Called by a tower before it reads the variables; blocks until an update of the budget is free and
        the staleness bound allows a start. Returns the update's ticket. Raises Stopped at shutdown."""
        return self.start_many()[0]

    def start_many(self, limit: int = 1, parts: int = 1) -> list[int]:
        """As `start`, for up to `limit` updates run in one call: without a bound, ceil(budget / `parts`) of
        them (at least 1, at most `limit`); with one, always 1. Returns their tickets."""
        with self._cond:
            while not self._stopping and (self._budget == 0 or not self._may_start() or self._should_stop()):
                self._cond.wait(0.1)  # a timeout: a stop request (a flag set by a signal) notifies nobody
            if self._stopping:
                raise Stopped
            count = 1 if self.ordered else max(1, min(limit, -(-self._budget // parts)))
            self._budget -= count
            tickets = list(range(self._next_ticket, self._next_ticket + count))
            self._next_ticket += count
            self._in_flight.extend(tickets)
            return tickets

    def _may_start(self) -> bool:
        return self.max_staleness < 0 or len(self._in_flight) <= self.max_staleness

    def wait_turn(self, ticket: int) -> None:
        """Called before applying: with a bound, waits until every earlier-started update is applied."""
        with self._cond:
            while not self._stopping and self.max_staleness >= 0 and self._in_flight[0] != ticket:
                self._cond.wait()
            if self._stopping:
                raise Stopped

    def finish(self, ticket: int) -> None:
        """Called after the update is applied."""
        self.finish_many([ticket], 1)

    def finish_many(self, tickets: list[int], applied: int) -> None:
        """Called after a call of `start_many`'s updates: `applied` of them landed; the others never started
        (the call was halted) and leave the window."""
        with self._cond:
            for ticket in tickets:
                self._in_flight.remove(ticket)
            self._unfinished -= len(tickets)
            self.finished += applied
            self._cond.notify_all()

    def fail(self, tower: int, error: BaseException) -> None:
        """Records the first tower error and stops every tower."""
        with self._cond:
            if self._error is None:
                failure = TowerFailed(f"tower {tower} failed: {type(error).__name__}: {error}")
                failure.__cause__ = error
                self._error = failure
            self._stopping = True
            self._halt()
            self._cond.notify_all()

    def stop(self) -> None:
        """Makes every waiting or later call raise Stopped."""
        with self._cond:
            self._stopping = True
            self._halt()
            self._cond.notify_all()
