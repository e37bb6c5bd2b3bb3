"""TensorFlow's C++ log lines: the threshold (TF_CPP_MIN_LOG_LEVEL) and the filter of what C++ code writes to
stderr while TensorFlow is imported, when absl ignores that threshold. Shared by `python -m trainer`
(`trainer.system.console`, which says what TensorFlow prints and why), `python -m data.prepare` and a user's
script that imports `data` (`quiet_first_import`); it lives here because `data` may not import `trainer`.
Imports no TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator

LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LEVEL = 3  # INFO, WARNING and ERROR hidden; FATAL shown
SEVERITIES = "IWEF"  # absl C++ log prefixes, in TF_CPP_MIN_LOG_LEVEL order
NATIVE_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.]+:\d+\] ")
# SentencePiece's own logging (its C++ copy inside tensorflow_text, whose level no API reaches), e.g.
# `normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty. use identity normalization.` at every load of a
# subword model built with identity normalization (data/subword.py): its severity, as TensorFlow's.
SENTENCEPIECE_LINE = re.compile(r"^[\w.]+\(\d+\) LOG\((?:(I)NFO|(W)ARNING|(E)RROR|(F)ATAL)\) ")
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
    match = NATIVE_LINE.match(line) or SENTENCEPIECE_LINE.match(line)
    return bool(match) and SEVERITIES.index(next(filter(None, match.groups()))) < level


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


def quiet_first_import(level: int):
    """A context for code that may import TensorFlow for the first time: sets TF_CPP_MIN_LOG_LEVEL to `level`
    unless the environment sets it, and drops from what is written to stderr meanwhile the lines below the
    threshold in force (absl's start-up lines). Does nothing once TensorFlow is imported: what the process
    chose then stands."""
    if "tensorflow" in sys.modules:
        return contextlib.nullcontext()
    os.environ.setdefault(LEVEL_ENV, str(level))
    return native_stderr_filtered(level_in_force())
