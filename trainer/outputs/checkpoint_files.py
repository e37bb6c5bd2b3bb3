"""The files of a checkpoint directory: the `checkpoint` state file, the checkpoints `ckpt-<N>` on disk, the
leftovers of interrupted saves, and whether a checkpoint reads back whole.

A run's checkpoints live in `model_dir/checkpoints/`, not in `model_dir` itself: TensorBoard's Projector
takes the newest checkpoint of the logdir and of every run directory (any directory with event files, and
`model_dir` is one: it holds the hparams session) for embeddings, and shows every 2-D variable and Keras 3
optimizer slot as one. `checkpoints/` holds no event files, so TensorBoard never looks there. Older runs kept
them in `model_dir`; `move_from_model_dir` moves them over on resume.

What TensorFlow 2.21 writes, and what it notices of damage (measured by damaging checkpoints of the cnn and
mlp runs one byte at a time; tests/trainer/outputs/test_checkpoint_faults.py keeps one case of each kind):
- A checkpoint `ckpt-N` is `ckpt-N.index` (an SSTable with block checksums) and `ckpt-N.data-00000-of-00001`
  (every tensor with its CRC32C; variant tensors such as the tf.data iterator state carry one per element).
  Reading every tensor back raised on each of 782 flipped bytes spread over a data file (DataLossError,
  InternalError), on truncation by even one byte (OutOfRangeError) and on every flipped index byte except
  the index's padding, where the checkpoint still restored bitwise-identical. So reading every tensor back
  is the integrity check; a manifest of hashes written beside each checkpoint would catch nothing more.
- A save writes `ckpt-N_temp/part-*.tempstate<random>`, renames those inside `ckpt-N_temp/`, renames the data
  file to `ckpt-N.data-*`, writes `ckpt-N.index` in place (not atomically), removes `ckpt-N_temp/`, records
  `ckpt-N` in the state file (atomically, through `checkpoint.tmp<hex>`), then deletes the checkpoints beyond
  the number kept, index before data. A SIGKILL can stop it between any two of these steps.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import time
import uuid

import tensorflow as tf
from google.protobuf import text_format

# The state file's proto. TensorFlow exports no public parser: `tf.train.get_checkpoint_state` returns None for
# some garbled files and raises for others (UnicodeDecodeError, ValueError), so the file is parsed here.
from tensorflow.python.training.checkpoint_state_pb2 import CheckpointState

from trainer.system import files

STATE_FILE = "checkpoint"
DIRECTORY = "checkpoints"  # under model_dir
_CHECKPOINT = re.compile(r"ckpt-(\d+)")
_DATA_FILE = re.compile(r"(ckpt-\d+)\.data-\d{5}-of-\d{5}")
_TEMP_DIR = re.compile(r"ckpt-\d+_temp")
_TEMP_FILE = re.compile(r"ckpt-\d+\.(index|data-\d{5}-of-\d{5})\.tempstate\d+|checkpoint\.tmp[0-9a-f]{32}")

# Errors that say the storage cannot be read right now, not that a checkpoint is damaged: skipping the
# checkpoint would throw away a good one, so they propagate.
_STORAGE_ERRORS = (
    tf.errors.PERMISSION_DENIED,
    tf.errors.UNAVAILABLE,
    tf.errors.RESOURCE_EXHAUSTED,
    tf.errors.DEADLINE_EXCEEDED,
    tf.errors.ABORTED,
    tf.errors.CANCELLED,
    tf.errors.UNAUTHENTICATED,
)
_DATA_PROBLEMS = {tf.errors.OUT_OF_RANGE: "data file truncated", tf.errors.NOT_FOUND: "data file missing"}


def directory(model_dir: str) -> str:
    """Where the checkpoints of the run in `model_dir` live."""
    return os.path.join(model_dir, DIRECTORY)


def any_saved(model_dir: str) -> bool:
    """Whether the run in `model_dir` has saved a checkpoint (in `checkpoints/`, or in `model_dir` itself as
    runs did before)."""
    return any(indexed(d) for d in (directory(model_dir), model_dir) if os.path.isdir(d))


def move_from_model_dir(model_dir: str) -> list[str]:
    """Moves the checkpoint files that runs before `checkpoints/` kept in `model_dir` (checkpoints, state
    file, leftovers of interrupted saves) into `checkpoints/`, unless `checkpoints/` has a state file of its
    own. One rename per file, the state file last, so a kill in between leaves every file whole in one of the
    two places and the state file still in `model_dir`: the next resume moves the rest. Returns the names
    moved."""
    target = directory(model_dir)
    if os.path.exists(os.path.join(target, STATE_FILE)):
        return []
    names = sorted(n for n in os.listdir(model_dir) if n == STATE_FILE or _checkpoint_file(n))
    if names:
        os.makedirs(target, exist_ok=True)
    for name in sorted(names, key=lambda n: n == STATE_FILE):
        os.replace(os.path.join(model_dir, name), os.path.join(target, name))
    return names


def _checkpoint_file(name: str) -> bool:
    return bool(
        _TEMP_DIR.fullmatch(name)
        or _TEMP_FILE.fullmatch(name)
        or _DATA_FILE.fullmatch(name)
        or (name.endswith(".index") and _CHECKPOINT.fullmatch(name[: -len(".index")]))
    )


def number(name: str) -> int:
    """The N of `ckpt-N`."""
    return int(_CHECKPOINT.fullmatch(name).group(1))


@dataclasses.dataclass
class State:
    """The state file: checkpoint names, oldest first (the last is the newest), and when each was written."""

    names: list[str]
    timestamps: dict[str, float]


def read_state(model_dir: str) -> tuple[State | None, str]:
    """Reads `model_dir/checkpoint`.

    Returns:
      (state, problem): the state and "" when it is sound; None and "missing" or "garbled (why)" otherwise.
    """
    path = os.path.join(model_dir, STATE_FILE)
    if not os.path.exists(path):
        return None, "missing"
    try:
        with open(path, "rb") as f:
            proto = text_format.Parse(f.read().decode("utf-8"), CheckpointState())
    except (UnicodeDecodeError, text_format.ParseError) as e:
        return None, f"garbled ({type(e).__name__}: {_first_line(str(e))})"
    latest = proto.model_checkpoint_path
    paths = list(proto.all_model_checkpoint_paths) or ([latest] if latest else [])  # a hand-written file
    names = [_own_name(model_dir, p) for p in paths]
    stamps = list(proto.all_model_checkpoint_timestamps)
    if not paths or None in names or paths[-1] != latest or len(stamps) not in (0, len(paths)):
        return None, f"garbled (names {', '.join(paths) or 'no checkpoint'})"
    return State(names, dict(zip(names, stamps, strict=False))), ""  # no timestamps when hand-written


def _own_name(model_dir: str, path: str) -> str | None:
    """`ckpt-N` when `path` names a checkpoint in `model_dir` (relative, or absolute there), else None."""
    directory, name = os.path.split(path)
    if directory and os.path.abspath(directory) != os.path.abspath(model_dir):
        return None
    return name if _CHECKPOINT.fullmatch(name) else None


def write_state(model_dir: str, names: list[str], timestamps: dict[str, float]) -> None:
    """Writes `model_dir/checkpoint` listing `names` (oldest first; the last is the newest), atomically.

    Every checkpoint gets a timestamp (`timestamps`, else its index file's mtime, else now) later than the
    "last preserved" one: `tf.train.CheckpointManager` only rotates away checkpoints newer than that.
    """
    stamps = [timestamps.get(n) or _mtime(os.path.join(model_dir, f"{n}.index")) for n in names]
    proto = CheckpointState(
        model_checkpoint_path=names[-1],
        all_model_checkpoint_paths=names,
        all_model_checkpoint_timestamps=stamps,
        last_preserved_timestamp=min(stamps) - 1.0,
    )
    path = os.path.join(model_dir, STATE_FILE)
    # the temporary name TensorFlow's own atomic write uses: `remove_interrupted` recognises one left behind
    files.write_atomically(path, text_format.MessageToString(proto), temp_suffix=f".tmp{uuid.uuid4().hex}")


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return time.time()


def indexed(model_dir: str) -> list[str]:
    """Names of the checkpoints whose index file is on disk, oldest first."""
    names = [entry[: -len(".index")] for entry in os.listdir(model_dir) if entry.endswith(".index")]
    return sorted((n for n in names if _CHECKPOINT.fullmatch(n)), key=number)


def remove_leftovers(model_dir: str, recorded: set[str]) -> list[str]:
    """Deletes what interrupted saves leave: `ckpt-N_temp/` folders, `*.tempstate<random>` and `checkpoint.tmp<hex>`
    files, and data files of a checkpoint that has no index and is not in the state file (`recorded`): its
    save stopped before writing the index, and without an index the data cannot be read.

    Returns:
      The names removed (folders with a trailing "/").
    """
    removed = []
    for entry in sorted(os.listdir(model_dir)):
        path = os.path.join(model_dir, entry)
        data = _DATA_FILE.fullmatch(entry)
        if _TEMP_DIR.fullmatch(entry) and os.path.isdir(path):
            shutil.rmtree(path)
            removed.append(entry + "/")
        elif _TEMP_FILE.fullmatch(entry) or (
            data
            and data.group(1) not in recorded
            and not os.path.exists(os.path.join(model_dir, f"{data.group(1)}.index"))
        ):
            os.remove(path)
            removed.append(entry)
    return removed


def unreadable(prefix: str) -> str | None:
    """Why the checkpoint `prefix` does not read back whole, in a few words with TensorFlow's error; None
    when every tensor in it reads back and matches its checksum.

    Each tensor is read on its own, so no more than the largest one is in memory at a time.

    Raises:
      tf.errors.OpError: the storage cannot be read now (permission denied, unavailable, ...), which says
        nothing about the checkpoint.
    """
    name = os.path.basename(prefix)
    if not os.path.exists(f"{prefix}.index"):
        return f"{name}.index missing"
    try:
        dtypes = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
    except tf.errors.OpError as e:
        return _problem("index file unreadable", e)
    with tf.device("/cpu:0"):
        for key in sorted(dtypes):
            try:
                tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[key], shape_and_slices=[""], dtypes=[dtypes[key]])
            except tf.errors.OpError as e:
                return _problem(_DATA_PROBLEMS.get(e.error_code, "data file corrupted"), e)
    return None


def _problem(what: str, error: tf.errors.OpError) -> str:
    if error.error_code in _STORAGE_ERRORS:
        raise error
    message = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", error.message)
    return f"{what} ({type(error).__name__}: {_first_line(message)})"


def _first_line(text: str, limit: int = 200) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."
