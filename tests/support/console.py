"""Acting on a run's console: a test waits for a line the run prints (an event), never for seconds."""

from __future__ import annotations

import re
import sys


class OnLine:
    """Stands in for sys.stdout and calls `action()` once, in the printing thread, when a line matching
    `pattern` is written (the run's lines are printed by `trainer.loop.build.log_line`). `fired` says whether
    it did: assert it, or a run that never printed the line would pass the test without the action."""

    def __init__(self, out, pattern: str, action):
        self._out, self._pattern, self._action = out, re.compile(pattern), action
        self.fired = False

    def write(self, text: str) -> int:
        if not self.fired and self._pattern.search(text):
            self.fired = True
            self._action()
        return self._out.write(text)

    def flush(self) -> None:
        self._out.flush()

    def __getattr__(self, name):  # fileno, isatty, encoding...: the real stream's
        return getattr(self._out, name)


def on_line(monkeypatch, pattern: str, action) -> OnLine:
    """Calls `action()` when the test's run prints a line matching `pattern`; undone with `monkeypatch`."""
    watch = OnLine(sys.stdout, pattern, action)
    monkeypatch.setattr(sys, "stdout", watch)
    return watch
