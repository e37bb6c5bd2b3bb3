"""Keeps TensorFlow's own log lines off the console of a normal run; `-v` / `--verbosity` brings them back.

Measured on TF 2.21 (CPU build, no CUDA driver), `import tensorflow` writes, twice (two libraries), the
banner `WARNING: All log messages before absl::InitializeLog() is called are written to STDERR` and
`I0000 ... port.cc] oneDNN custom operations are on ...`, `I0000 ... cudart_stub.cc] Could not find cuda
drivers ...` whatever TF_CPP_MIN_LOG_LEVEL says: absl's C++ logging ignores the threshold until it is
initialised (tensorflow#100442). Later lines do honour it: `cpu_feature_guard.cc` (INFO, gone at level 1),
and `E0000 ... cuda_platform.cc] failed call to cuInit ...` (ERROR, gone only at level 3; hiding the GPUs
with CUDA_VISIBLE_DEVICES="" does not remove it: TensorFlow still calls cuInit, which then fails).

So a normal run sets TF_CPP_MIN_LOG_LEVEL=3 (unless the environment sets it) and applies the same threshold
itself to the lines written to stderr while TensorFlow is imported, passing every other line through. FATAL
lines always show; an error TensorFlow raises still reaches towerflow as an exception, printed by our code.
With `--device=cpu` the GPUs are hidden from TensorFlow (CUDA_VISIBLE_DEVICES=""), so a CPU run on a GPU
node neither creates GPU devices nor takes their memory. Imports no TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LEVEL = 3  # INFO, WARNING and ERROR hidden; FATAL shown
SEVERITIES = "IWEF"  # absl C++ log prefixes, in TF_CPP_MIN_LOG_LEVEL order
NATIVE_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.]+:\d+\] ")
BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def native_log_level(verbosity: int | None) -> int:
    """TF_CPP_MIN_LOG_LEVEL for absl's --verbosity (None: not given): 1 and 0 show everything (INFO up),
    -1 from WARNING, -2 from ERROR, -3 and below FATAL only."""
    if verbosity is None:
        return QUIET_LEVEL
    return min(QUIET_LEVEL, max(0, -verbosity))


def prepare_tensorflow(device: str, verbosity: int | None) -> int:
    """Sets TensorFlow's environment before it is imported; returns the C++ log threshold now in force.

    An explicit --verbosity decides the threshold; without it, one set in the environment is kept.
    """
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before TensorFlow's import, which reads it once
    if verbosity is None:
        os.environ.setdefault(LEVEL_ENV, str(QUIET_LEVEL))
    else:
        os.environ[LEVEL_ENV] = str(native_log_level(verbosity))
    try:
        return int(os.environ[LEVEL_ENV])
    except ValueError:
        return 0


def is_noise(line: str, level: int) -> bool:
    """Whether a stderr line is a TensorFlow C++ log line (or absl's banner) below the threshold `level`."""
    if line.startswith(BANNER):
        return level > 0
    match = NATIVE_LINE.match(line)
    return bool(match) and SEVERITIES.index(match.group(1)) < level


@contextlib.contextmanager
def native_stderr_filtered(level: int):
    """Holds back what C++ code (and anything else) writes to file descriptor 2 inside the block, then
    writes it out without the lines `is_noise` at `level`. Level 0: does nothing."""
    if level <= 0:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode(errors="replace")
            kept = [line for line in text.splitlines(keepends=True) if not is_noise(line, level)]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()
