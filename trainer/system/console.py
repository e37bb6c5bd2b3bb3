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
node neither creates GPU devices nor takes their memory. Imports no TensorFlow. The threshold, `HARMLESS` and
the filter are `data.native_log`'s, shared with `python -m data.prepare` and `import data` (data may not
import trainer); this module adds the flags' level, the hidden GPUs and the filter process.

Some lines are noise at any threshold: `HARMLESS` lists TensorFlow's C++ lines known to say nothing wrong
about a towerflow run (each with why), dropped whatever their severity unless -v shows everything (level 0).
They come while a run runs, not only while TensorFlow is imported (a worker's remote functions, the chief's
remote iterators; with a TF_CPP_MIN_LOG_LEVEL below 3, the cuInit line as the devices start), and so do
SentencePiece's INFO lines (tensorflow_text's copy, loading a subword model), so every process of a run sends
its stderr through `filter_from_now`: a filter process of its own, `python -m trainer.system.console LEVEL`,
that passes every other line at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

# The threshold, the known-harmless lines and the filter live in `data.native_log`, which `python -m data.prepare`
# and `import data` use too (data may not import trainer); they are this module's names as well.
from data.native_log import (  # noqa: F401
    BANNER,
    HARMLESS,
    LEVEL_ENV,
    MESSAGE_LINES_MAX,
    NATIVE_LINE,
    QUIET_LEVEL,
    SEVERITIES,
    Harmless,
    _harmless,
    is_noise,
    kept,
    level_in_force,
    native_stderr_filtered,
)


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
    return level_in_force()


def filter_from_now(level: int) -> None:
    """From now until the process ends, file descriptor 2 goes through a filter process that writes out
    what `kept` keeps at `level`, line by line as it comes. A separate process, so that nothing is lost when
    this one dies (it reads to the end); it ignores stop signals (Slurm signals every process of a step) and
    ends when the last writer has gone. Level 0: does nothing."""
    if level <= 0:
        return
    sys.stderr.flush()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "trainer.system.console", str(level)]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=2, env=env, start_new_session=True)
    os.dup2(child.stdin.fileno(), 2)
    child.stdin.close()  # fd 2 is now the only writer: its end (this process's) ends the filter


def _filter(level: int) -> None:
    """The filter process: stdin -> stdout as `kept` keeps it, each line flushed as it goes."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    lines = (line.decode(errors="replace") for line in iter(sys.stdin.buffer.readline, b""))
    for line in kept(lines, level):
        sys.stdout.write(line)
        sys.stdout.flush()


if __name__ == "__main__":
    _filter(int(sys.argv[1]))
