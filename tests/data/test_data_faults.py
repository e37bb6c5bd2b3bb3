"""Bad data is named, never a traceback, never a loop: corrupt records (bad CRC, truncated file), records that
do not parse or decode, labels outside [0, num_classes), in training and eval data; the --max_bad_records
budget. Library tests assert the messages and counts; `python -m trainer` runs assert exit codes."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess

import numpy as np
import pytest
import tensorflow as tf

import data
from tests.support.records import _collect, _count_records, _images, _write_ids
from tests.support.runs import cpu_flags, run_trainer
from trainer.loop import run


def _offsets(path: str) -> list[int]:
    """Byte offset of every record's frame (8-byte length, 4-byte CRC, payload, 4-byte CRC)."""
    lengths = [len(r.numpy()) for r in tf.data.TFRecordDataset(path)]
    return [int(v) for v in np.cumsum([0] + [n + 16 for n in lengths[:-1]])]


def _flip_payload_byte(path: str, record: int) -> int:
    """Flips one payload byte of `record` (its CRC then fails); returns the record's frame offset."""
    offset = _offsets(path)[record]
    content = bytearray(pathlib.Path(path).read_bytes())
    content[offset + 12 + 3] ^= 0xFF
    pathlib.Path(path).write_bytes(bytes(content))
    return offset


def _truncate_inside(path: str, record: int) -> int:
    """Cuts the file 20 bytes into `record`'s frame; returns the frame offset."""
    offset = _offsets(path)[record]
    pathlib.Path(path).write_bytes(pathlib.Path(path).read_bytes()[: offset + 20])
    return offset


def _ids(dataset, num_batches: int) -> list[int]:
    return _collect(dataset, num_batches)[0][:, 0].astype(int).tolist()


# The library: data.BadRecords and make_dataset.


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_training_record_is_named_by_file_index_and_offset(tmp_path, damage):
    paths = _write_ids(tmp_path, num_examples=40, num_shards=4)  # 10 records per file
    offset = (_flip_payload_byte if damage == "flip" else _truncate_inside)(paths[1], 3)
    info = data.inspect_records(str(tmp_path / "ids-*"))
    bad = data.BadRecords()
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        _collect(data.make_dataset(info, batch_size=8, training=True, bad_records=bad), 5)
    message = str(bad.explain(error.value, training=True))
    skipped = os.path.getsize(paths[1]) - offset
    assert message == (
        f"--train_data has 1 corrupt record (bad CRC or truncated file), more than --max_bad_records=0: "
        f"{paths[1]}: record 3 at byte offset {offset} (the file's last {skipped} bytes). Rewrite the file(s), "
        "leave them out of --train_data, or raise --max_bad_records to skip each corrupt record and the rest "
        "of its file"
    )
    assert bad.count == 1


def test_budget_skips_the_rest_of_the_file_and_counts_each_record_once(tmp_path, capfd):
    paths = _write_ids(tmp_path, num_examples=40, num_shards=4)  # file 1 holds ids 10..19
    offset = _flip_payload_byte(paths[1], 3)
    info = data.inspect_records(str(tmp_path / "ids-*"))
    bad = data.BadRecords(max_bad_records=2)
    dataset = data.make_dataset(info, batch_size=11, training=True, shuffle_buffer=8, bad_records=bad)
    ids = _ids(dataset, 9)  # 3 epochs of 33 records: ids 13..19 are lost with the corrupt record 3 of file 1
    for epoch in range(3):
        assert sorted(ids[33 * epoch : 33 * (epoch + 1)]) == [*range(13), *range(20, 40)]
    size = os.path.getsize(paths[1])
    assert bad.corrupt_records() == [data.integrity.CorruptRecord(paths[1], 3, offset, size - offset)]
    assert bad.count == 1
    warnings = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning: skipping")]
    assert warnings == [
        f'warning: skipping corrupt record 3 of "{paths[1]}" at byte offset {offset} and the rest of that file, '
        "in every epoch; 1 of --max_bad_records=2"
    ]


def test_one_corrupt_record_past_the_budget_fails_naming_all(tmp_path):
    paths = _write_ids(tmp_path, num_examples=40, num_shards=4)
    first, second = _flip_payload_byte(paths[1], 3), _truncate_inside(paths[2], 9)
    info = data.inspect_records(str(tmp_path / "ids-*"))
    bad = data.BadRecords(max_bad_records=1)
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        _collect(data.make_dataset(info, batch_size=8, training=True, bad_records=bad), 5)
    message = str(bad.explain(error.value, training=True))
    assert message.startswith("--train_data has 2 corrupt records (bad CRC or truncated file), more than ")
    assert f"{paths[1]}: record 3 at byte offset {first} " in message
    assert f"{paths[2]}: record 9 at byte offset {second} (the file's last 20 bytes)" in message


def test_a_checkpoint_without_budget_resumes_with_one(tmp_path):
    """A run that failed on a corrupt record resumes from its checkpoint with --max_bad_records: the
    reader is the same whatever the budget, and the table of skipped records is checkpointed with it."""
    _write_ids(tmp_path, num_examples=200, num_shards=4)
    info = data.inspect_records(str(tmp_path / "ids-*"))

    def fresh(budget: int):
        bad = data.BadRecords(budget)
        dataset = data.make_dataset(info, batch_size=8, training=True, seed=1, shuffle_buffer=16, bad_records=bad)
        return iter(dataset), bad

    before, bad = fresh(0)
    _ids(tf.data.Dataset.from_tensors(next(before)), 1)
    bad.table.insert(tf.constant([7], tf.int64), tf.constant([123], tf.int64))
    path = tf.train.Checkpoint(iterator=before, table=bad.table).save(str(tmp_path / "ckpt" / "c"))
    want = [next(before)[0].numpy().tobytes() for _ in range(3)]
    after, resumed = fresh(3)
    tf.train.Checkpoint(iterator=after, table=resumed.table).restore(path).assert_consumed()
    assert [next(after)[0].numpy().tobytes() for _ in range(3)] == want
    assert resumed.count == 1


def test_label_outside_num_classes_names_file_label_and_flags(tmp_path):
    labels = np.array([1, 2, 3, 4, 5, 1, 2, 3])  # stored 1-based; 5 - 1 = 4 = num_classes
    paths = data.write_dense_records(str(tmp_path / "d"), np.zeros((8, 2)), labels, num_shards=2)
    info = data.inspect_records(str(tmp_path / "d-*"), data.DenseSchema(label_offset=1))
    bad = data.BadRecords()
    dataset = data.make_dataset(info, batch_size=8, training=False, num_classes=4, bad_records=bad)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"a label is outside \[0, num_classes=4\)") as error:
        _collect(dataset)
    assert str(bad.explain(error.value, training=False)) == (
        f"--eval_data file {paths[1]}: record 0 (byte offset 0) has label 4 (stored 5, --label_offset=1), "
        "outside [0, --num_classes=4); fix --num_classes or --label_offset, or the labels"
    )
    # In range (num_classes=5), the same records read through.
    assert _collect(data.make_dataset(info, batch_size=8, training=False, num_classes=5))[1].tolist() == [*labels - 1]


def test_records_that_do_not_parse_or_decode_are_named(tmp_path):
    paths = data.write_image_records(str(tmp_path / "i"), _images(12, 4, 4, 1), np.arange(12) % 3, num_shards=2)
    records = [r.numpy() for r in tf.data.TFRecordDataset(paths[1])]
    example = tf.train.Example.FromString(records[2])
    example.features.feature["image/encoded"].bytes_list.value[0] = b"\x89PNG but nothing more"
    records[2], records[4] = example.SerializeToString(), b"not a protocol buffer"
    with tf.io.TFRecordWriter(paths[1]) as writer:
        for record in records:
            writer.write(record)
    info = data.inspect_records(str(tmp_path / "i-*"))
    offsets = _offsets(paths[1])
    assert str(data.find_bad_record(info, num_classes=3)) == (
        f"file {paths[1]}: record 2 (byte offset {offsets[2]}) holds an image that cannot be decoded (TensorFlow: "
        "Unknown image file format. One of JPEG, JPEG XL, PNG, GIF, BMP, WebP required.)"
    )
    # Without decoding (the eval check before training), the record that is no Example is the first found.
    with pytest.raises(data.DataError) as error:
        data.check_records(info, num_classes=3, what="--eval_data")
    assert str(error.value).startswith(
        f"--eval_data file {paths[1]}: record 4 (byte offset {offsets[4]}) is not a serialized tf.train.Example ("
    )


def test_check_records_counts_and_names_a_corrupt_eval_record(tmp_path):
    paths = _write_ids(tmp_path, num_examples=30, num_shards=3)
    info = data.inspect_records(str(tmp_path / "ids-*"))
    assert data.check_records(info, num_classes=7) == 30
    offset = _flip_payload_byte(paths[2], 6)
    with pytest.raises(data.DataError) as error:
        data.check_records(info, num_classes=7, what="--eval_data")
    assert str(error.value) == (
        f"--eval_data file {paths[2]}: record 6 at byte offset {offset} is corrupt (TensorFlow: corrupted record "
        f"at {offset + 12}); the rest of the file cannot be read. Rewrite the file or leave it out of the pattern"
    )


@pytest.mark.parametrize("cut", [3, 11])
def test_check_records_names_an_eval_file_cut_inside_a_record_header(tmp_path, cut):
    """TFRecordDataset stops without an error where a file ends inside a frame's 12-byte header: the byte
    count against the file's size finds it."""
    paths = _write_ids(tmp_path, num_examples=30, num_shards=3)
    offset = _offsets(paths[1])[6]
    pathlib.Path(paths[1]).write_bytes(pathlib.Path(paths[1]).read_bytes()[: offset + cut])
    assert _count_records(paths[1]) == 6  # silently
    with pytest.raises(data.DataError) as error:
        data.check_records(data.inspect_records(str(tmp_path / "ids-*")), num_classes=7, what="--eval_data")
    assert str(error.value) == (
        f"--eval_data file {paths[1]}: record 6 at byte offset {offset} is corrupt (the file ends {cut} bytes into "
        "the record's 16-byte frame: it was cut short); the rest of the file cannot be read. Rewrite the file or "
        "leave it out of the pattern"
    )


def _write_with_feature(path: str, record: int, index: int, value: float) -> None:
    """Rewrites `record` of a dense file with feature `index` set to `value`."""
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    example = tf.train.Example.FromString(records[record])
    example.features.feature["features"].float_list.value[index] = value
    records[record] = example.SerializeToString()
    with tf.io.TFRecordWriter(path) as writer:
        for serialized in records:
            writer.write(serialized)


@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
def test_non_finite_features_are_named_in_eval_and_after_a_divergence(tmp_path, value):
    paths = _write_ids(tmp_path, num_examples=30, num_shards=3)
    _write_with_feature(paths[2], 4, 1, value)
    info = data.inspect_records(str(tmp_path / "ids-*"))
    named = (
        f"file {paths[2]}: record 4 (byte offset {_offsets(paths[2])[4]}) has feature value {value} at index 1 "
        "under key 'features' (1 of 2 values NaN or inf): fix the record or leave its file out"
    )
    with pytest.raises(data.DataError) as error:
        data.check_records(info, num_classes=7, what="--eval_data")
    assert str(error.value) == f"--eval_data {named}"
    # The training pipeline lets them through (no cost per batch); a divergence looks for them.
    bad = data.BadRecords()
    features, _ = _collect(data.make_dataset(info, batch_size=10, training=True, bad_records=bad), 3)
    assert np.isfinite(features).sum() == features.size - 1
    diverged = RuntimeError("the gradient was not finite at step 3")
    lines = []
    assert str(bad.explain_divergence(diverged, log=lines.append)) == (
        f"--train_data {named} (training diverged: the gradient was not finite at step 3)"
    )
    assert lines == [
        "training diverged (the gradient was not finite at step 3); reading --train_data for NaN or inf features"
    ]
    _write_with_feature(paths[2], 4, 1, 1.0)
    assert bad.explain_divergence(diverged) is None  # the training's own divergence


def test_errors_that_are_not_the_input_pipelines_are_not_explained(tmp_path):
    _write_ids(tmp_path, num_examples=8, num_shards=1)
    bad = data.BadRecords()
    data.make_dataset(data.inspect_records(str(tmp_path / "ids-*")), batch_size=4, training=True, bad_records=bad)
    assert bad.explain(ValueError("no TensorFlow error"), training=True) is None
    assert bad.explain(tf.errors.ResourceExhaustedError(None, None, "OOM in a matmul"), training=True) is None
    # From the pipeline, but the data checks out: not the data's fault either.
    assert bad.explain(tf.errors.UnavailableError(None, None, "[[IteratorGetNext]]"), training=True) is None


def test_the_trainer_exposes_the_count_of_skipped_records(tmp_path, make_config):
    train = data.write_dense_records(str(tmp_path / "t"), np.ones((64, 4)), np.arange(64) % 2, num_shards=4)
    data.write_dense_records(str(tmp_path / "e"), np.ones((8, 4)), np.arange(8) % 2)
    _truncate_inside(train[1], 5)
    files = {"train_data": str(tmp_path / "t-*"), "eval_data": str(tmp_path / "e-*"), "num_classes": 2}
    state = run.build(make_config(data={**files, "max_bad_records": 1}, model={"name": "mlp"}))
    assert state.updater.train_steps(3).steps == 3  # 192 examples: every file read at least once
    assert state.bad_records.count == 1
    assert state.bad_records.corrupt_records()[0].path == train[1]


# `python -m trainer`: exit codes and the one-line message.


def _trainer(*args: str, model_dir) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    flags = cpu_flags(
        model="mlp",
        global_batch_size=32,
        train_steps=12,
        log_every_steps=6,
        eval_every_steps=6,
        checkpoint_every_steps=6,
        export=False,
    )
    return run_trainer(*flags, f"--model_dir={model_dir}", *args, env=env)


def _write_run_data(tmp_path) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(0)
    features, labels = rng.normal(size=(256, 8)).astype(np.float32), rng.integers(0, 4, 256)
    train = data.write_dense_records(str(tmp_path / "train"), features, labels, num_shards=4)
    evaluation = data.write_dense_records(str(tmp_path / "eval"), features[:64], labels[:64], num_shards=2)
    return train, evaluation


def _data_flags(tmp_path) -> list[str]:
    return [f"--train_data={tmp_path / 'train-*'}", f"--eval_data={tmp_path / 'eval-*'}", "--num_classes=4"]


def _error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_cli_corrupt_train_file_exits_2_naming_it_then_a_budget_finishes(tmp_path, damage):
    train, _ = _write_run_data(tmp_path)
    offset = (_flip_payload_byte if damage == "flip" else _truncate_inside)(train[1], 40)
    model_dir = tmp_path / "run"
    line = _error_line(_trainer(*_data_flags(tmp_path), model_dir=model_dir))
    assert line.startswith("error: --train_data has 1 corrupt record (bad CRC or truncated file), more than ")
    assert f"--max_bad_records=0: {train[1]}: record 40 at byte offset {offset} " in line
    if damage == "truncate":
        return  # the same path; one rerun with a budget is enough
    rerun = _trainer(*_data_flags(tmp_path), "--max_bad_records=3", model_dir=model_dir)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    warnings = [x for x in rerun.stderr.splitlines() if x.startswith("warning: skipping corrupt record")]
    assert warnings == [
        f'warning: skipping corrupt record 40 of "{train[1]}" at byte offset {offset} and the rest of that '
        "file, in every epoch; 1 of --max_bad_records=3"
    ]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert (metrics["global_step"], metrics["bad_records"]) == (12, 1)


def test_cli_corrupt_eval_file_exits_2_before_any_checkpoint(tmp_path):
    _, evaluation = _write_run_data(tmp_path)
    offset = _flip_payload_byte(evaluation[1], 5)
    line = _error_line(_trainer(*_data_flags(tmp_path), "--max_bad_records=10", model_dir=tmp_path / "run"))
    assert line == (
        f"error: --eval_data file {evaluation[1]}: record 5 at byte offset {offset} is corrupt (TensorFlow: "
        f"corrupted record at {offset + 12}); the rest of the file cannot be read. Rewrite the file or leave it "
        "out of the pattern"
    )
    assert not list((tmp_path / "run").glob("**/ckpt-*"))


def test_cli_async_label_of_num_classes_exits_2_naming_file_label_and_flags(tmp_path):
    train, _ = _write_run_data(tmp_path)
    records = [r.numpy() for r in tf.data.TFRecordDataset(train[2])]
    example = tf.train.Example.FromString(records[17])
    example.features.feature["label"].int64_list.value[0] = 4
    records[17] = example.SerializeToString()
    with tf.io.TFRecordWriter(train[2]) as writer:
        for record in records:
            writer.write(record)
    # Tower 0 reads files 0 and 2 (128 records, 8 updates an epoch); async towers share the steps by speed,
    # so the run is long enough that tower 0 reads all of its share whatever the split (12 steps were not).
    steps = ["--train_steps=400", "--log_every_steps=100", "--eval_every_steps=400", "--checkpoint_every_steps=400"]
    result = _trainer(*_data_flags(tmp_path), "--update_mode=async", *steps, model_dir=tmp_path / "run")
    assert _error_line(result) == (
        f"error: --train_data file {train[2]}: record 17 (byte offset {_offsets(train[2])[17]}) has label 4 "
        "(stored 4, --label_offset=0), outside [0, --num_classes=4); fix --num_classes or --label_offset, or "
        "the labels"
    )


def test_cli_eval_file_cut_inside_a_record_header_exits_2_naming_it(tmp_path):
    _, evaluation = _write_run_data(tmp_path)
    offset = _offsets(evaluation[1])[7]
    pathlib.Path(evaluation[1]).write_bytes(pathlib.Path(evaluation[1]).read_bytes()[: offset + 5])
    line = _error_line(_trainer(*_data_flags(tmp_path), model_dir=tmp_path / "run"))
    assert line == (
        f"error: --eval_data file {evaluation[1]}: record 7 at byte offset {offset} is corrupt (the file ends 5 bytes "
        "into the record's 16-byte frame: it was cut short); the rest of the file cannot be read. Rewrite the file "
        "or leave it out of the pattern"
    )
    assert not list((tmp_path / "run").glob("**/ckpt-*"))


def test_cli_nan_feature_in_training_exits_2_naming_it_and_a_fixed_file_resumes(tmp_path):
    """The record is named (not exit 3); the step-6 checkpoint is whole, and once the record is fixed the rerun
    resumes there to the weights of a run on the fixed data."""
    train, _ = _write_run_data(tmp_path)
    fixed = tmp_path / "fixed"
    assert _trainer(*_data_flags(tmp_path), "--deterministic", model_dir=fixed).returncode == 0
    original = pathlib.Path(train[1]).read_bytes()
    _write_with_feature(train[1], 40, 3, float("nan"))
    model_dir = tmp_path / "run"
    result = _trainer(*_data_flags(tmp_path), "--deterministic", model_dir=model_dir)
    # Which check sees the NaN first follows the machine's kernels: the gradient's (the host this test was
    # written on) or the loss of its micro-batch's (an AVX2 host, 2026-11-29); either way the line names the record.
    assert re.match(
        re.escape(
            f"error: --train_data file {train[1]}: record 40 (byte offset {_offsets(train[1])[40]}) has feature "
            "value nan at index 3 under key 'features' (1 of 8 values NaN or inf): fix the record or leave its file "
            "out (training diverged: "
        )
        + r"(the gradient|the loss of micro-batch \d \(tower \d\)) was not finite at step \d+",
        _error_line(result),
    ), _error_line(result)
    assert sorted(p.name for p in (model_dir / "checkpoints").glob("*.index")) == ["ckpt-6.index"]
    pathlib.Path(train[1]).write_bytes(original)
    rerun = _trainer(*_data_flags(tmp_path), "--deterministic", model_dir=model_dir)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resumed from {model_dir / 'checkpoints' / 'ckpt-6'} at step 6" in rerun.stdout
    weights = [json.loads((d / "metrics.json").read_text())["weights_sha256"] for d in (fixed, model_dir)]
    assert weights[0] == weights[1]
