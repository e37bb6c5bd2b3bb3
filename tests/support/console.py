"""Acting on a run's console: a test waits for a line the run prints (an event), never for seconds; and what
is not towerflow's on a console."""

from __future__ import annotations

import re
import sys

# Lines of TensorFlow's, absl's or SentencePiece's on a console: absl's C++ and Python prefix (`E0000 ...`,
# `W1129 03:27:17.288189 ... checkpoint.py:225]`), a C++ source position (`cuda_platform.cc:52]`,
# `normalizer.cc(51)`), absl's banner, the CPU feature note's second line, anything about CUDA.
FOREIGN = re.compile(
    r"^[IWEF]\d{4} |\.cc[:(]\d+|^WARNING: All log messages before absl|^To enable the following instructions|cuda|CUDA"
)


def foreign_lines(*texts: str) -> list[str]:
    """The lines of `texts` (a command's stdout, stderr) that are not towerflow's (`FOREIGN`)."""
    return [line for text in texts for line in text.splitlines() if FOREIGN.search(line)]


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
