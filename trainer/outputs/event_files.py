"""The TensorBoard event files a run leaves in `model_dir`: dropping what a resume writes again, and repairing a
torn last record.

A resumed run trains again from its checkpoint's step, so the events an earlier start wrote past that step
would repeat (TensorBoard would draw the steps twice). A full disk or a kill while an event is written leaves a
torn record at the end of a file; reading it raises `DataLossError` (or, cut inside its 12-byte header,
silently stops), so each file's records are counted against its size and a file with a torn tail is cut back
to its last whole record, with one line saying so, instead of failing every later start.
"""

from __future__ import annotations

import os

import tensorflow as tf
from tensorboard.compat.proto import event_pb2

from data.check import first_line
from data.options import with_run_options
from data.schema import FRAME_BYTES

EVENT_FILE_PREFIX = "events.out.tfevents."
_TEMP_SUFFIX = ".purging"
# Records a run writes anew at every start; a resume drops the old ones.
_REWRITTEN_PLUGINS = ("hparams", "custom_scalars")


def event_files(model_dir: str) -> list[str]:
    """The event files of `model_dir` and of its subdirectories (`train/`, `eval/`), sorted. Listed, not
    globbed: a `--model_dir` such as `exp[1]` or `a*b` is a name, not a pattern."""
    directories = [model_dir]
    if os.path.isdir(model_dir):
        directories += sorted(e.path for e in os.scandir(model_dir) if e.is_dir())
    found = []
    for directory in directories:
        for entry in os.scandir(directory):
            if entry.name.startswith(EVENT_FILE_PREFIX) and not entry.name.endswith(_TEMP_SUFFIX) and entry.is_file():
                found.append(entry.path)
    return sorted(found)


def purge_events(model_dir: str, after_step: int, log=print) -> int:
    """Drops, from the event files of model_dir (train/, eval/ and model_dir itself), every event past
    `after_step` and every hparams and custom-scalars record, so that a resumed run's steps stay strictly
    increasing per tag and its settings are recorded once (the resumed run writes them anew, with the new
    `--train_steps`); cuts a file with a torn or corrupt record back to the whole records before it, calling
    `log` with one line per such file. Returns how many events past `after_step` it dropped.

    Files are rewritten only when they hold such events or records, each to a temporary file then renamed over
    the original: a kill in between leaves the old file or the new one, never half of either.
    """
    dropped = 0
    for path in event_files(model_dir):
        records, torn = read_whole_records(path)
        events = [event_pb2.Event.FromString(r) for r in records]
        keep = [e for e in events if not _purged(e, after_step)]
        if torn is None and len(keep) == len(events):
            continue
        with tf.io.TFRecordWriter(path + _TEMP_SUFFIX) as writer:
            for event in keep:
                writer.write(event.SerializeToString())
        os.replace(path + _TEMP_SUFFIX, path)
        dropped += sum(1 for e in events if e.step > after_step)
        if torn is not None:
            log(f"TensorBoard: {path}: {torn}; cut the file back to the {len(records)} whole events before them")
    return dropped


def read_whole_records(path: str) -> tuple[list[bytes], str | None]:
    """The records of a TFRecord file up to the first that is not whole, and what is wrong from there on
    (None: every byte of the file is in a whole record)."""
    records, problem = [], None
    iterator = iter(with_run_options(tf.data.TFRecordDataset(path)))
    while True:
        try:
            records.append(next(iterator).numpy())
        except StopIteration:
            break
        except tf.errors.DataLossError as e:
            problem = f"TensorFlow: {first_line(e.message)}"
            break
    whole = sum(len(r) + FRAME_BYTES for r in records)
    size = os.path.getsize(path)
    if whole == size:
        return records, None
    problem = problem or f"the file ends inside a record's {FRAME_BYTES}-byte frame"
    return records, (
        f"its last {size - whole} bytes, from byte offset {whole}, are no whole record ({problem}), as a write cut "
        "short by a full disk or a kill leaves"
    )


def _purged(event, after_step: int) -> bool:
    if event.step > after_step:
        return True
    return any(v.metadata.plugin_data.plugin_name in _REWRITTEN_PLUGINS for v in event.summary.value)
