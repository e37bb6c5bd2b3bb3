"""A --model_dir is a name, never a pattern (`exp[1]`, `*`, `?`): reruns resume, --keep_checkpoints holds and
TensorBoard steps do not repeat. A torn TensorBoard event file (a full disk or a kill mid-write) is cut back to
its whole records with one line, and the run goes on to the uninterrupted run's weights."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import tensorflow as tf

from tests.support.runs import cpu_flags, run_trainer
from trainer.outputs import checkpoint_files
from trainer.outputs.event_files import event_files, purge_events, read_whole_records

STEPS = 18


def _trainer(model_dir, train_steps: int) -> subprocess.CompletedProcess:
    """mlp on 2 CPU towers, constant learning rate: a run resumed at step s is the uninterrupted run's steps."""
    flags = cpu_flags(
        model="mlp",
        deterministic=True,
        lr_schedule="constant",
        log_every_steps=3,
        eval_every_steps=6,
        checkpoint_every_steps=3,
        keep_checkpoints=2,
        export=False,
        train_steps=train_steps,
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = run_trainer(*flags, f"--model_dir={model_dir}", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _weights(model_dir) -> str:
    return json.loads((model_dir / "metrics.json").read_text())["weights_sha256"]


def _steps(model_dir, split: str, tag: str) -> list[int]:
    """The steps of `tag` in model_dir/split, over every event file, in the order the files were written."""
    steps = []
    for path in event_files(str(model_dir / split)):
        for event in tf.compat.v1.train.summary_iterator(path):
            steps += [event.step for value in event.summary.value if value.tag == tag]
    return steps


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(weights of the uninterrupted 18-step run, a run stopped at step 12), each trained once."""
    base = tmp_path_factory.mktemp("runs")
    _trainer(base / "reference", STEPS)
    _trainer(base / "at12", 12)
    return _weights(base / "reference"), base / "at12"


def test_a_model_dir_named_like_a_pattern_resumes_rotates_and_purges(tmp_path, runs):
    reference, _ = runs
    run = tmp_path / "exp[1]*?"
    _trainer(run, 12)
    checkpoints = run / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["checkpoint", *checkpoint_files_of(9, 12)]  # --keep_checkpoints=2
    # killed after step 12's events but before its checkpoint: events 10..12 are written again
    for name in checkpoint_files_of(12):
        os.remove(checkpoints / name)
    checkpoint_files.write_state(str(checkpoints), ["ckpt-9"], {})
    resumed = _trainer(run, STEPS)
    assert f"resumed from {checkpoints / 'ckpt-9'} at step 9" in resumed.stdout
    assert _weights(run) == reference
    assert sorted(os.listdir(checkpoints)) == ["checkpoint", *checkpoint_files_of(15, 18)]
    assert _steps(run, "train", "loss") == [1, 3, 6, 9, 10, 12, 15, 18]  # each start logs its first step
    assert _steps(run, "eval", "accuracy") == [6, 12, 18]


def checkpoint_files_of(*steps: int) -> list[str]:
    return sorted(f"ckpt-{s}{suffix}" for s in steps for suffix in (".index", ".data-00000-of-00001"))


def _cut(path: str) -> tuple[int, int]:
    """Cuts the last record's frame 3 bytes short; returns (its offset, the bytes left of it)."""
    size, last = os.path.getsize(path), len(list(tf.data.TFRecordDataset(path))[-1].numpy()) + 16
    os.truncate(path, size - 3)
    return size - last, last - 3


def _append_garbage(path: str) -> tuple[int, int]:
    """Appends 40 bytes that are no record; returns (their offset, 40)."""
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(bytes(range(7, 47)))
    return size, 40


@pytest.mark.parametrize("damage", [_cut, _append_garbage], ids=["cut", "garbage"])
def test_a_torn_event_file_is_cut_back_and_the_run_goes_on(tmp_path, runs, damage):
    reference, at12 = runs
    run = tmp_path / "run"
    shutil.copytree(at12, run)
    (torn,) = event_files(str(run / "train"))
    whole = len(list(tf.data.TFRecordDataset(torn))) - (damage is _cut)
    offset, torn_bytes = damage(torn)
    resumed = _trainer(run, STEPS)
    lines = [x for x in resumed.stdout.splitlines() if x.startswith("TensorBoard: ")]
    assert len(lines) == 1, resumed.stdout
    assert lines[0].startswith(f"TensorBoard: {torn}: its last {torn_bytes} bytes, from byte offset {offset}, are ")
    assert lines[0].endswith(f"; cut the file back to the {whole} whole events before them")
    assert os.path.getsize(torn) == offset and read_whole_records(torn)[1] is None
    assert _weights(run) == reference
    assert _steps(run, "train", "loss") == [1, 3, 6, 9, 12, 13, 15, 18]


@pytest.mark.parametrize("tail", [b"\x05\x00\x00", b"\x00" * 11, b"torn" * 9])
def test_a_tail_cut_inside_a_frame_header_or_corrupt_is_found(tmp_path, tail):
    """TFRecordDataset stops silently at a tail shorter than a frame's 12-byte header: the size tells."""
    (tmp_path / "train").mkdir()
    path = str(tmp_path / "train" / "events.out.tfevents.1.host")
    with tf.io.TFRecordWriter(path) as writer:
        for step in range(3):
            writer.write(tf.compat.v1.Event(step=step, wall_time=1.0).SerializeToString())
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(tail)
    lines = []
    assert purge_events(str(tmp_path), after_step=1, log=lines.append) == 1  # step 2 dropped
    why = "the file ends inside a record's 16-byte frame" if len(tail) < 12 else "TensorFlow: corrupted record at"
    assert len(lines) == 1
    assert lines[0].startswith(f"TensorBoard: {path}: its last {len(tail)} bytes, from byte offset {size}, are ")
    assert f"are no whole record ({why}" in lines[0]
    assert [e.step for e in tf.compat.v1.train.summary_iterator(path)] == [0, 1]
    assert read_whole_records(path)[1] is None
