"""How a long piece of work shows on the console: what it is, how far it is, how long it has taken.

Training has its live line (`trainer.outputs.progress`); the work around it has `Phase`, with the same two
faces. On a terminal, a live line redrawn at most once a second (`\\r` and erase-line, as training's), erased
when the phase ends, so the line that says its result takes its place. Off a terminal (a Slurm log, a pipe),
nothing for the first `FIRST_LINE_SEC` (a phase of a few seconds adds no line to the log), then a line every
`LINE_EVERY_SEC`: a three-minute eval writes three lines, never one per batch.

A small thread draws, so that work that reports nothing while it runs (an export, one long call) shows too;
`update` only stores numbers. It lives here, beside `data.native_log`, because `python -m data.prepare` shows
phases too and `data` may not import `trainer`. Imports no TensorFlow.
"""

from __future__ import annotations

import sys
import threading
import time

FIRST_LINE_SEC = 10.0  # off a terminal: a phase shorter than this writes no line
LINE_EVERY_SEC = 60.0  # off a terminal: then a line a minute
REDRAW_SEC = 1.0  # on a terminal


def is_terminal(stream) -> bool:
    """Whether `stream` is a terminal: only there is a line redrawn (a log file gets whole lines)."""
    return hasattr(stream, "isatty") and stream.isatty()


def format_duration(seconds: float) -> str:
    """h:mm:ss."""
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _number(value: float) -> str:
    """A count as a count (3,836), a measure with one decimal (4.7)."""
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


class Phase:
    """One long piece of work on the console; a context manager (`with Phase(...) as phase: phase.update(n)`).

    Args:
      what: what is being done, e.g. "eval at step 1000", "exporting to export/1000".
      total: how much there is to do in `unit`s, when known (the line then says how far, in percent).
      unit: what `update` counts ("examples", "MB"); "" for work that counts nothing (the line says how long).
      detail: a few words shown after the count until `update` says others (e.g. "writing the SavedModel").
      stream: where to write (stdout by default).
      live: a live line (True) or log lines (False); None: a live line when `stream` is a terminal.
      clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, what: str, total=None, unit: str = "", detail: str = "", stream=None, live=None, clock=None):
        self.what, self.total, self.unit = what, total, unit
        self.stream = stream or sys.stdout
        self.live = is_terminal(self.stream) if live is None else live
        self.clock = clock or time.monotonic
        self.done: float = 0
        self.detail = detail
        self.started = self.clock()
        self._next = self.started + (REDRAW_SEC if self.live else FIRST_LINE_SEC)
        self._shown = False
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._thread = None

    def __enter__(self) -> Phase:
        self.poll()  # due at once only when FIRST_LINE_SEC is 0 (tests)
        self._thread = threading.Thread(target=self._draw_until_ended, name=f"phase: {self.what}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.end()

    def update(self, done: float, detail: str | None = None) -> None:
        """How far the work is (in `unit`s), and optionally a few words more (e.g. "3 shards written")."""
        self.done = done
        if detail is not None:
            self.detail = detail

    def line(self, now: float) -> str:
        """The text shown: what, how far, how long."""
        parts = [self.detail] if self.detail else []
        if self.unit and self.total:
            share = f" ({100 * self.done / self.total:.0f}%)" if self.done <= self.total else ""
            parts.insert(0, f"{_number(self.done)} of {_number(self.total)} {self.unit}{share}")
        elif self.unit:
            parts.insert(0, f"{_number(self.done)} {self.unit}")
        parts.append(f"{format_duration(now - self.started)} so far")
        return f"{self.what}: {', '.join(parts)}"

    def poll(self) -> None:
        """Draws when it is time; the thread calls it, tests may too."""
        with self._lock:
            now = self.clock()
            if now < self._next or self._ended.is_set():
                return
            if self.live:
                self.stream.write(f"\r\033[K{self.line(now)}")
                self._next = now + REDRAW_SEC
            else:
                self.stream.write(f"{self.line(now)}\n")
                self._next = now + LINE_EVERY_SEC
            self.stream.flush()
            self._shown = True

    def end(self) -> None:
        """Stops drawing and erases the live line (a log line stays)."""
        with self._lock:
            self._ended.set()
            if self._shown and self.live:
                self.stream.write("\r\033[K")
                self.stream.flush()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _draw_until_ended(self) -> None:
        while not self._ended.wait(min(REDRAW_SEC, 0.25)):
            self.poll()


class Unshown:
    """A phase that shows nothing: what `shown` gives when there is no console to show it on."""

    def __enter__(self) -> Unshown:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def update(self, done: float, detail: str | None = None) -> None:
        pass


def shown(what: str, stream, **kwargs) -> Phase | Unshown:
    """A `Phase` on `stream` (its other arguments as `Phase`'s), or an `Unshown` one when `stream` is None: for
    library code that shows progress only when its command asks."""
    return Phase(what, stream=stream, **kwargs) if stream is not None else Unshown()
