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

Some lines are noise at any threshold: `HARMLESS` lists TensorFlow's C++ lines known to say nothing wrong
about a towerflow run (each with why), dropped whatever their severity unless -v shows everything (level 0).
A job of several tasks prints them while it runs, not only while TensorFlow is imported (a worker's remote
functions, the chief's remote iterators), so its tasks send their stderr through `filter_from_now`: a filter
process of their own, `python -m trainer.system.console LEVEL`, that passes every other line at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator

LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LEVEL = 3  # INFO, WARNING and ERROR hidden; FATAL shown
SEVERITIES = "IWEF"  # absl C++ log prefixes, in TF_CPP_MIN_LOG_LEVEL order
NATIVE_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.]+:\d+\] ")
BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


@dataclasses.dataclass(frozen=True)
class Harmless:
    """A TensorFlow C++ log message known to be harmless: `says` matches the text after its `E0000 .. file.cc:N] `
    prefix; a message of several lines goes on with lines `more` matches, up to the one `ends` matches (None:
    one line)."""

    says: str
    why: str
    more: str = ""
    ends: str | None = None


# The one list of known-harmless TensorFlow lines (docs/console.md shows it); a real error never matches one.
HARMLESS = (
    Harmless(
        r"failed call to cuInit: .*UNKNOWN ERROR \(303\)",
        "a node without a GPU driver (every --device=cpu run; --num_gpus beyond the GPUs found fails in towerflow's "
        "own words)",
    ),
    Harmless(
        r"NodeDef mentions attribute use_unbounded_threadpool which is not in the op definition",
        "the chief's input pipeline sent to a worker: the attribute is new and ignored, as the line itself says",
    ),
    Harmless(
        r"Failed to clear function handle cache: UNIMPLEMENTED: Releasing a multi-device component handle on a "
        r"remote device is not yet implemented",
        "an input iterator on a worker freed at the end of a start: its memory goes with the worker's process",
    ),
    Harmless(
        r"Type inference failed\. This indicates an invalid graph that escaped type checking\. Error message: "
        r"INVALID_ARGUMENT: expected a subtype of goo\.gle/debug",
        "the type checker of tf.data's map loops (TensorListSetItem), a warning only: the graph runs as built",
        more=r"^(type_id: \w+$|args \{$|  type_id: \w+$|\}$|$| for input \d+ of a homogeneous container"
        r"|\twhile inferring)",
        ends=r"^\twhile inferring type of node ",
    ),
    Harmless(
        r"Local rendezvous is aborting with status: ABORTED: Cleanup -?\d+",
        "a worker's tensor exchanges for a step already finished, torn down as its server stops after the chief "
        "ended the run (timing-dependent, seen on a healthy 4-task run's last line); a failure's abort names "
        "another status, and the chief's error line says what failed",
    ),
)
MESSAGE_LINES_MAX = 40  # a multi-line message whose end does not come within this many lines is shown after all


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


def level_in_force() -> int:
    """The C++ log threshold `prepare_tensorflow` put in the environment (0, everything, if it cannot be read)."""
    try:
        return int(os.environ.get(LEVEL_ENV, "0"))
    except ValueError:
        return 0


def is_noise(line: str, level: int) -> bool:
    """Whether a stderr line is a TensorFlow C++ log line (or absl's banner) below the threshold `level`, or
    the first line of a `HARMLESS` one (level > 0)."""
    return level > 0 and (line.startswith(BANNER) or _harmless(line) is not None or _below(line, level))


def _below(line: str, level: int) -> bool:
    match = NATIVE_LINE.match(line)
    return bool(match) and SEVERITIES.index(match.group(1)) < level


def _harmless(line: str) -> Harmless | None:
    match = NATIVE_LINE.match(line)
    if match:
        return next((h for h in HARMLESS if re.match(h.says, line[match.end() :])), None)
    return None


def kept(lines: Iterable[str], level: int) -> Iterator[str]:
    """The lines to show, in order, as they come: without `is_noise` ones, and without the rest of a
    `HARMLESS` message of several lines. Those are held until the message's last line; a line that cannot be
    part of it (another thread's, a real error), or no end in time, shows everything held."""
    held: list[str] = []  # a harmless message of several lines, until its last line
    message = None
    for line in lines:
        if message is not None:
            if re.match(message.more, line) and len(held) < MESSAGE_LINES_MAX:
                held.append(line)
                if re.match(message.ends, line):  # the whole message dropped
                    held, message = [], None
                continue
            yield from held  # not the message it looked like
            held, message = [], None
        if not is_noise(line, level):
            yield line
        elif (harmless := _harmless(line)) is not None and harmless.ends is not None:
            held, message = [line], harmless
    yield from held  # the stream ended inside the message


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
            sys.stderr.write("".join(kept(text.splitlines(keepends=True), level)))
            sys.stderr.flush()


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
