"""A task's own records (data.FeatureSchema): the writer, inspection and the full check naming task, feature
and file, and the two pipelines: exact padded batches and bucket choice, `<key>_length`, the streams' share
of an epoch, bit-for-bit resume, the per-example seed, too-long and corrupt records, eval order."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import data
from data import augment, feature_pipeline

TASK = "demo"
BUCKETS = (8, 16, 40)


def _schema(max_length: int = 40, tokens_dtype: str = "int64") -> data.FeatureSchema:
    buckets = BUCKETS if max_length == 40 else ()
    features = {
        "tokens": data.Feature(tokens_dtype, max_length=max_length, pad=-1, buckets=buckets),
        "x": data.Feature("float32", shape=(3,)),
        "label": data.Feature("int64"),
    }
    return data.FeatureSchema.of(features, TASK)


def _example(label: int, length: int) -> dict:
    """Record `label`: tokens label * 100 + [0, length), x = label + (0, 0.5, 0.25)."""
    return {"tokens": label * 100 + np.arange(length), "x": label + np.array([0, 0.5, 0.25]), "label": [label]}


def _lengths(count: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(1, 41, size=count).tolist()


def _write_files(tmp_path, num_files: int = 4, per_file: int = 10, long: tuple[int, int] | None = None) -> list[str]:
    """Files of `per_file` records each, labels 0, 1, ... in file order; `long` = (file, record) holds 52 tokens."""
    lengths = _lengths(num_files * per_file)
    paths = []
    for f in range(num_files):
        labels = range(f * per_file, (f + 1) * per_file)
        examples = [_example(i, 52 if long == (f, i - f * per_file) else lengths[i]) for i in labels]
        paths.append(str(tmp_path / f"feat-{f}.tfrecord"))
        assert data.write_feature_records(paths[-1], examples, _schema(max_length=100 if long else 40)) == per_file
    return paths


def _with_seed(example, seed, training):
    del training
    return {**example, "seed": seed}


def _numpy(batch: dict) -> dict:
    return {key: value.numpy() for key, value in batch.items()}


def _info(tmp_path) -> data.RecordInfo:
    return data.inspect_feature_records(str(tmp_path / "feat-*"), _schema(), what="train_data")


@pytest.mark.quick
def test_eval_batches_are_padded_to_the_smallest_bucket_with_true_lengths(tmp_path):
    lengths = [3, 5, 9, 1, 2, 7, 20, 4, 6, 8]
    path = str(tmp_path / "feat-0.tfrecord")
    data.write_feature_records(path, [_example(i, n) for i, n in enumerate(lengths)], _schema())
    info = _info(tmp_path)
    assert (info.files, info.example_shape, info.schema) == ((path,), (), _schema())
    batches = [_numpy(b) for b in data.feature_eval_dataset(info, data.Stream(batch_size=4), _with_seed)]
    assert [b["tokens"].shape for b in batches] == [(4, 16), (4, 40), (2, 8)]  # longest 9, 20, 8
    assert [b["tokens_length"].tolist() for b in batches] == [[3, 5, 9, 1], [2, 7, 20, 4], [6, 8]]
    expected = np.full((4, 16), -1)
    for row, n in enumerate(lengths[:4]):
        expected[row, :n] = row * 100 + np.arange(n)
    np.testing.assert_array_equal(batches[0]["tokens"], expected)
    assert batches[0]["tokens"].dtype == np.int64 and batches[0]["tokens_length"].dtype == np.int32
    np.testing.assert_array_equal(batches[2]["x"], [[8, 8.5, 8.25], [9, 9.5, 9.25]])
    assert np.concatenate([b["label"] for b in batches]).tolist() == list(range(10))
    # The eval seed is the record's: epoch -1, its index in this worker's records.
    key = augment.stream_key(0, 0)
    seeds = np.concatenate([b["seed"] for b in batches])
    for index in (0, 9):
        expected_seed = feature_pipeline.example_seed(key, tf.constant([-1, index], tf.int64))
        np.testing.assert_array_equal(seeds[index], expected_seed.numpy())
    assert seeds.dtype == np.int32 and len({tuple(s) for s in seeds.tolist()}) == 10
    assert seeds[0].tolist() == [-1150567015, 1991393470]  # pinned: a change changes every run's draws


@pytest.mark.quick
def test_eval_reads_every_record_once_in_order_with_a_short_last_batch(tmp_path):
    _write_files(tmp_path)  # 40 records
    info = _info(tmp_path)
    batches = [_numpy(b) for b in data.feature_eval_dataset(info, data.Stream(batch_size=12), _with_seed)]
    assert [len(b["label"]) for b in batches] == [12, 12, 12, 4]
    assert np.concatenate([b["label"] for b in batches]).tolist() == list(range(40))
    lengths = np.concatenate([b["tokens_length"] for b in batches])
    assert lengths.tolist() == _lengths(40)
    halves = [data.Stream(batch_size=7, worker_index=w, num_workers=2) for w in range(2)]
    labels = [[int(v) for b in data.feature_eval_dataset(info, s, _with_seed) for v in b["label"]] for s in halves]
    assert labels == [[*range(10), *range(20, 30)], [*range(10, 20), *range(30, 40)]]


@pytest.mark.parametrize(
    "num_streams", [pytest.param(1, marks=pytest.mark.quick), pytest.param(3, marks=pytest.mark.quick), 6]
)
def test_the_streams_share_one_epoch_of_every_record_once_with_positional_seeds(tmp_path, num_streams):
    _write_files(tmp_path)
    info = _info(tmp_path)
    seen = []
    for w in range(num_streams):
        stream = data.Stream(batch_size=1, worker_index=w, num_workers=num_streams, seed=5, shuffle_buffer=16)
        share = data.order.training_share(info.files, w, num_streams)
        size = sum(len(range(share.index, 10, share.count)) for _ in share.files)
        dataset = data.feature_training_dataset(info, stream, _with_seed, resume_from=(0, 0))
        key = augment.stream_key(5, w)
        for record, (batch, position) in enumerate(dataset.take(size + 1)):
            epoch, after = position.numpy().tolist()
            assert (epoch, after) == ((0, record + 1) if record < size else (1, 1))
            # Two int32 draws keyed on the position's key: seed, stream, epoch, record; nothing else.
            position_key = augment.example_key(key, tf.constant([epoch, after], tf.int64))
            seed = tf.random.stateless_uniform([2], position_key, minval=None, maxval=None, dtype=tf.int32).numpy()
            np.testing.assert_array_equal(batch["seed"].numpy()[0], seed)
            if record < size:
                seen.append(int(batch["label"].numpy()[0]))
    assert sorted(seen) == list(range(40))


@pytest.mark.quick
def test_a_resume_mid_epoch_continues_bit_for_bit(tmp_path):
    _write_files(tmp_path)
    info = _info(tmp_path)
    stream = data.Stream(batch_size=4, worker_index=1, num_workers=2, seed=7, shuffle_buffer=8)  # 20 records
    whole = list(data.feature_training_dataset(info, stream, _with_seed, resume_from=(0, 0)).take(13))
    again = list(data.feature_training_dataset(info, stream, _with_seed).take(13))  # batches alone
    cut = 3  # after 12 records of epoch 0
    position = tuple(whole[cut - 1][1].numpy().tolist())
    assert position == (0, 12)
    resumed = list(data.feature_training_dataset(info, stream, _with_seed, resume_from=position).take(13 - cut))
    for (batch, pos), same in zip(whole[cut:], resumed, strict=True):
        assert tuple(pos.numpy()) == tuple(same[1].numpy())
        assert sorted(batch) == sorted(same[0]) == ["label", "seed", "tokens", "tokens_length", "x"]
        for key in batch:
            assert np.array_equal(batch[key].numpy(), same[0][key].numpy()), key
    for (batch, _), same in zip(whole, again, strict=True):
        assert all(np.array_equal(batch[key].numpy(), same[key].numpy()) for key in batch)
    first_epoch = np.concatenate([b["label"].numpy() for b, _ in whole[:5]])  # worker 1 of 2: files 1 and 3
    assert sorted(first_epoch.tolist()) == [*range(10, 20), *range(30, 40)]
    shapes = {b["tokens"].shape[1] for b, _ in whole}
    assert shapes <= set(BUCKETS) and all(
        b["tokens"].shape[1] == min(n for n in BUCKETS if n >= b["tokens_length"].numpy().max()) for b, _ in whole
    )


def _offsets(path: str) -> list[int]:
    lengths = [len(r.numpy()) for r in tf.data.TFRecordDataset(path)]
    return [int(v) for v in np.cumsum([0] + [n + 16 for n in lengths[:-1]])]


@pytest.mark.quick
def test_a_too_long_record_is_named_by_task_feature_file_record_and_length(tmp_path):
    paths = _write_files(tmp_path, long=(2, 3))
    info = _info(tmp_path)  # every file's first record is fine
    named = f"task 'demo': feature 'tokens' of {paths[2]} record 3 has 52 values, more than its max_length 40"
    with pytest.raises(data.DataError) as error:
        data.check_feature_records(info, "eval_data")
    assert str(error.value) == f"{named} (--eval_data)"
    bad = data.BadRecords()
    with pytest.raises(tf.errors.InvalidArgumentError) as failure:
        list(data.feature_training_dataset(info, data.Stream(batch_size=8, bad_records=bad), _with_seed).take(5))
    assert "task demo: feature tokens holds more than its max_length 40:] [52]" in str(failure.value)
    assert str(bad.explain(failure.value, training=True)) == f"--train_data {named}"


@pytest.mark.quick
@pytest.mark.parametrize("problem", ["dtype", "missing", "shape"])
def test_a_schema_mismatch_is_named_by_task_feature_and_file(tmp_path, problem):
    paths = _write_files(tmp_path, num_files=3, per_file=2)
    if problem == "dtype":
        schema, key, text = _schema(tokens_dtype="float32"), "tokens", "holds float_list, the task reads int64"
    elif problem == "missing":
        schema = data.FeatureSchema.of({k: f for k, f in _schema().features if k != "x"}, TASK)
        key, text = "x", "is missing (keys found: label, tokens)"
    else:
        schema = data.FeatureSchema.of({**_schema().as_dict(), "x": data.Feature("float32", shape=(2, 2))}, TASK)
        key, text = "x", "has 4 values, the task reads 3 (shape (3,))"
    wrong = {**_example(2, 4), "x": np.zeros(4) if problem == "shape" else _example(2, 4)["x"]}
    wrong = {k: v for k, v in wrong.items() if k in schema.as_dict()}
    data.write_feature_records(paths[1], [wrong], schema)
    with pytest.raises(data.DataError) as error:
        _info(tmp_path)
    assert str(error.value) == f"task 'demo': feature '{key}' of {paths[1]} {text}"
    # Third in its file, the same record passes inspection; the full check names it.
    data.write_feature_records(str(tmp_path / "wrong"), [wrong], schema)
    records = [r.numpy() for r in tf.data.TFRecordDataset([paths[0], str(tmp_path / "wrong")])]
    with tf.io.TFRecordWriter(paths[1]) as writer:
        for record in records:
            writer.write(record)
    with pytest.raises(data.DataError) as error:
        data.check_feature_records(_info(tmp_path), "eval_data")
    assert str(error.value) == f"task 'demo': feature '{key}' of {paths[1]} record 2 {text} (--eval_data)"


@pytest.mark.quick
@pytest.mark.parametrize("cut", [20, 5])  # bytes into record 4's frame: its payload, its 12-byte header
def test_a_truncated_file_within_max_bad_records_is_skipped_and_named_by_the_check(tmp_path, cut):
    paths = _write_files(tmp_path)
    offset = _offsets(paths[1])[4]
    pathlib.Path(paths[1]).write_bytes(pathlib.Path(paths[1]).read_bytes()[: offset + cut])
    info = _info(tmp_path)
    bad = data.BadRecords(max_bad_records=1)
    stream = data.Stream(batch_size=2, shuffle_buffer=8, bad_records=bad)
    dataset = data.feature_training_dataset(info, stream, _with_seed, resume_from=(0, 0))
    labels = [int(v) for batch, _ in dataset.take(34) for v in batch["label"].numpy()]  # 2 epochs of 34 records
    for epoch in range(2):
        assert sorted(labels[34 * epoch : 34 * (epoch + 1)]) == [*range(14), *range(20, 40)]
    assert bad.count == 1
    with pytest.raises(data.DataError) as error:
        data.check_feature_records(info, "eval_data")
    if cut == 20:  # TensorFlow's reader fails
        assert str(error.value).startswith(f"task 'demo': {paths[1]} record 4 at byte offset {offset} is corrupt (")
    else:  # TensorFlow's reader stops without an error: the file's size tells
        assert str(error.value) == f"task 'demo': file {paths[1]} ends 5 bytes into record 4 (--eval_data)"
    assert os.path.getsize(paths[1]) == offset + cut


@pytest.mark.quick
def test_varying_preprocess_outputs_are_padded_as_the_variable_feature(tmp_path):
    path = str(tmp_path / "feat-0.tfrecord")
    data.write_feature_records(path, [_example(i, n) for i, n in enumerate([3, 5, 9, 1])], _schema())
    info = _info(tmp_path)

    def shifted(example, seed, training):
        del seed, training
        tokens = example["tokens"]
        return {"inputs": tf.cast(tokens[:-1], tf.int32), "targets": tokens[1:], "label": example["label"]}

    (batch,) = [_numpy(b) for b in data.feature_eval_dataset(info, data.Stream(batch_size=4), shifted)]
    assert sorted(batch) == ["inputs", "inputs_length", "label", "targets", "targets_length"]
    assert batch["inputs"].dtype == np.int32 and batch["inputs"].shape == (4, 8)
    assert batch["inputs_length"].tolist() == batch["targets_length"].tolist() == [2, 4, 8, 0]
    np.testing.assert_array_equal(batch["targets"][0], [1, 2, -1, -1, -1, -1, -1, -1])

    def grid(example, seed, training):  # 2-D and of varying length: no way to pad it
        del seed, training
        return {"grid": tf.zeros([tf.size(example["tokens"]), 2])}

    with pytest.raises(data.DataError, match=r"preprocess output 'grid' has shape \(None, 2\): only 1-D outputs"):
        data.feature_eval_dataset(info, data.Stream(batch_size=4), grid)


def _pool_rows(batches) -> list[tuple[int, tuple[int, ...]]]:
    rows = [(label, seed) for b in batches for label, seed in zip(b["label"], b["seed"].tolist(), strict=True)]
    return sorted((int(label), tuple(seed)) for label, seed in rows)


@pytest.mark.quick
def test_length_grouping_sorts_each_pool_and_resumes_mid_pool_exactly(tmp_path):
    _write_files(tmp_path)  # one stream of 40 records an epoch: the 4th pool of 12 spans two epochs
    info = _info(tmp_path)
    stream = data.Stream(batch_size=4, seed=3, shuffle_buffer=8)
    plain = list(data.feature_training_dataset(info, stream, _with_seed, resume_from=(0, 0)).take(12))
    grouped = list(
        data.feature_training_dataset(info, stream, _with_seed, resume_from=(0, 0, 0), group_batches=3).take(12)
    )
    plain, plain_at = [_numpy(b) for b, _ in plain], [tuple(p.numpy()) for _, p in plain]
    batches, positions = [_numpy(b) for b, _ in grouped], [tuple(p.numpy()) for _, p in grouped]
    orders = []  # each pool's batches by their rank in length
    for pool in range(4):
        ours, theirs = batches[3 * pool : 3 * pool + 3], plain[3 * pool : 3 * pool + 3]
        assert _pool_rows(ours) == _pool_rows(theirs)  # the same examples, with the same seeds
        lengths = sorted((b["tokens_length"] for b in ours), key=lambda x: x.min())
        assert np.all(np.diff(np.concatenate(lengths)) >= 0)  # each batch a run of the pool's sorted lengths
        orders.append([sorted(b.min() for b in lengths).index(b["tokens_length"].min()) for b in ours])
        start = (0, 0) if pool == 0 else plain_at[3 * pool - 1]
        assert positions[3 * pool : 3 * pool + 3] == [(*start, 1), (*start, 2), (*plain_at[3 * pool + 2], 0)]
    assert [b["tokens"].shape[1] for b in batches] == [
        min(n for n in BUCKETS if n >= b["tokens_length"].max()) for b in batches
    ]
    assert orders == [[2, 1, 0], [2, 0, 1], [1, 0, 2], [0, 1, 2]]  # pinned: shuffled, keyed on the pool
    assert positions[4] == (*plain_at[2], 2)
    resumed = data.feature_training_dataset(info, stream, _with_seed, resume_from=positions[4], group_batches=3)
    for (batch, position), same, at in zip(resumed.take(7), batches[5:], positions[5:], strict=True):
        assert tuple(position.numpy()) == at
        assert all(np.array_equal(batch[key].numpy(), same[key]) for key in same)
