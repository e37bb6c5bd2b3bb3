"""Tests of data/: schemas, reader pipeline, writer, digits cache, `python -m data.prepare`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import data
from data import digits, prepare, synthetic


def _images(n: int, height: int, width: int, channels: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, height, width, channels), dtype=np.uint8)


def _write_ids(tmp_path, num_examples: int = 40, num_shards: int = 4, name: str = "ids") -> list[str]:
    """Dense records whose feature[0] is the example's id, so tests can tell examples apart."""
    ids = np.arange(num_examples, dtype=np.float32)
    features = np.stack([ids, ids * 0.5], axis=1)
    return data.write_dense_records(str(tmp_path / name), features, ids.astype(np.int64) % 7, num_shards=num_shards)


def _collect(dataset: tf.data.Dataset, num_batches: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    batches = list(dataset.take(num_batches) if num_batches else dataset)
    features = np.concatenate([x.numpy() for x, _ in batches])
    labels = np.concatenate([y.numpy() for _, y in batches])
    return features, labels


def _count_records(pattern: str) -> int:
    return sum(1 for _ in tf.data.TFRecordDataset(list(data.list_files(pattern))))


# Round trips.


@pytest.mark.parametrize("channels", [1, 3])
def test_png_round_trip_is_exact(tmp_path, channels):
    images = _images(10, 5, 4, channels)
    labels = np.arange(10) % 3
    paths = data.write_image_records(str(tmp_path / "img"), images, labels, num_shards=2)
    assert paths == [str(tmp_path / "img-00000-of-00002"), str(tmp_path / "img-00001-of-00002")]

    info = data.inspect_records(str(tmp_path / "img-*"))
    assert info == data.RecordInfo(data.ImageSchema(), (5, 4, channels), tuple(paths))
    dataset = data.make_dataset(info, batch_size=4, training=False)
    assert dataset.element_spec[0].shape.as_list() == [None, 5, 4, channels]
    train_spec = data.make_dataset(info, batch_size=4, training=True).element_spec
    assert train_spec == (tf.TensorSpec([4, 5, 4, channels], tf.float32), tf.TensorSpec([4], tf.int32))
    assert [tuple(x.shape) for x, _ in dataset] == [(4, 5, 4, channels), (4, 5, 4, channels), (2, 5, 4, channels)]
    features, read_labels = _collect(dataset)
    assert features.dtype == np.float32 and read_labels.dtype == np.int32
    np.testing.assert_array_equal(features, images.astype(np.float32) / np.float32(255))
    np.testing.assert_array_equal(read_labels, labels)


def test_jpeg_round_trip_is_close(tmp_path):
    # A smooth image: JPEG keeps it within a few levels, where random noise would not survive.
    ramp = np.linspace(0, 255, 16 * 16 * 3).reshape(1, 16, 16, 3)
    images = np.concatenate([ramp, 255 - ramp]).astype(np.uint8)
    data.write_image_records(str(tmp_path / "jpg"), images, np.array([4, 2]), image_format="jpeg")
    info = data.inspect_records(str(tmp_path / "jpg-*"))
    assert info.example_shape == (16, 16, 3)
    features, labels = _collect(data.make_dataset(info, batch_size=8, training=False))
    assert features.shape == (2, 16, 16, 3)
    np.testing.assert_allclose(features, images / 255.0, atol=0.05)
    np.testing.assert_array_equal(labels, [4, 2])


def test_image_records_use_imagenet_keys(tmp_path):
    (path,) = data.write_image_records(str(tmp_path / "img"), _images(1, 3, 2, 1), np.array([5]), label_offset=1)
    example = tf.train.Example.FromString(next(iter(tf.data.TFRecordDataset(path))).numpy())
    feature = example.features.feature
    assert set(feature) == {
        "image/encoded",
        "image/format",
        "image/class/label",
        "image/height",
        "image/width",
        "image/channels",
        "image/colorspace",
    }
    assert feature["image/format"].bytes_list.value == [b"PNG"]
    assert feature["image/colorspace"].bytes_list.value == [b"Grayscale"]
    assert feature["image/class/label"].int64_list.value == [6]
    assert [feature[k].int64_list.value[0] for k in ("image/height", "image/width", "image/channels")] == [3, 2, 1]


def test_dense_round_trip_with_custom_keys(tmp_path):
    features = np.random.default_rng(1).normal(size=(9, 6)).astype(np.float32)
    labels = np.arange(9) % 4
    data.write_dense_records(str(tmp_path / "d"), features, labels, num_shards=3, feature_key="x", label_key="y")
    schema = data.DenseSchema(feature_key="x", label_key="y")
    info = data.inspect_records(str(tmp_path / "d-*"), schema)
    assert info.schema == schema and info.example_shape == (6,) and len(info.files) == 3
    read_features, read_labels = _collect(data.make_dataset(info, batch_size=4, training=False))
    np.testing.assert_array_equal(read_features, features)
    np.testing.assert_array_equal(read_labels, labels)


def test_label_offset_is_subtracted(tmp_path):
    labels = np.array([0, 1, 2, 3])
    data.write_image_records(str(tmp_path / "img"), _images(4, 2, 2, 3), labels, label_offset=1)
    raw = data.inspect_records(str(tmp_path / "img-*"))
    np.testing.assert_array_equal(_collect(data.make_dataset(raw, batch_size=4, training=False))[1], labels + 1)
    info = data.inspect_records(str(tmp_path / "img-*"), data.ImageSchema(label_offset=1))
    np.testing.assert_array_equal(_collect(data.make_dataset(info, batch_size=4, training=False))[1], labels)

    data.write_dense_records(str(tmp_path / "d"), np.zeros((3, 2)), np.array([5, 6, 7]))
    dense = data.inspect_records(str(tmp_path / "d-*"), data.DenseSchema(label_offset=5))
    np.testing.assert_array_equal(_collect(data.make_dataset(dense, batch_size=3, training=False))[1], [0, 1, 2])


def test_auto_detection(tmp_path):
    data.write_image_records(str(tmp_path / "img"), _images(2, 3, 3, 1), np.array([0, 1]))
    _write_ids(tmp_path, num_examples=4, num_shards=1)
    assert data.inspect_records(str(tmp_path / "img-*")).schema == data.ImageSchema()
    assert data.inspect_records(str(tmp_path / "ids-*")).schema == data.DenseSchema()
    assert data.inspect_records(str(tmp_path / "ids-*")).example_shape == (2,)


def test_image_size_resizes_mixed_sizes(tmp_path):
    data.write_image_records(str(tmp_path / "a"), np.full((3, 8, 8, 1), 100, np.uint8), np.zeros(3, int))
    data.write_image_records(str(tmp_path / "b"), np.full((2, 6, 4, 1), 200, np.uint8), np.ones(2, int))
    schema = data.ImageSchema(image_size=(5, 7))
    info = data.inspect_records(f"{tmp_path / 'a-*'},{tmp_path / 'b-*'}", schema)
    assert info.example_shape == (5, 7, 1)
    features, labels = _collect(data.make_dataset(info, batch_size=5, training=False))
    assert features.shape == (5, 5, 7, 1)
    # Bilinear resizing of a constant image keeps the constant.
    np.testing.assert_allclose(features[:3], 100 / 255, rtol=1e-6)
    np.testing.assert_allclose(features[3:], 200 / 255, rtol=1e-6)
    np.testing.assert_array_equal(labels, [0, 0, 0, 1, 1])


def test_mixed_sizes_without_image_size_name_the_flag(tmp_path):
    data.write_image_records(str(tmp_path / "a"), _images(2, 8, 8, 1), np.zeros(2, int))
    data.write_image_records(str(tmp_path / "b"), _images(2, 6, 6, 1), np.zeros(2, int))
    info = data.inspect_records(str(tmp_path / "*-of-*"))
    assert info.example_shape == (8, 8, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="--image_size"):
        _collect(data.make_dataset(info, batch_size=4, training=False))


def test_reads_a_minimal_record_written_elsewhere(tmp_path):
    """Only image/encoded (JPEG) and image/class/label, as some third-party converters write."""
    image = np.full((6, 5, 3), 128, np.uint8)
    example = tf.train.Example(
        features=tf.train.Features(
            feature={
                "image/encoded": tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[tf.io.encode_jpeg(image).numpy()])
                ),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[7])),
            }
        )
    )
    with tf.io.TFRecordWriter(str(tmp_path / "third_party.tfrecord")) as writer:
        writer.write(example.SerializeToString())
    info = data.inspect_records(str(tmp_path / "*.tfrecord"), data.ImageSchema(label_offset=1))
    assert info.example_shape == (6, 5, 3)
    features, labels = _collect(data.make_dataset(info, batch_size=2, training=False))
    assert features.shape == (1, 6, 5, 3)
    np.testing.assert_allclose(features, 128 / 255, atol=2 / 255)
    np.testing.assert_array_equal(labels, [6])


# The training pipeline: determinism, checkpoints, sharding.


@pytest.mark.parametrize("kind", ["image", "dense"])
def test_iterator_checkpoint_restores_bitwise(tmp_path, kind):
    if kind == "image":
        data.write_image_records(str(tmp_path / "r"), _images(30, 4, 4, 3), np.arange(30) % 5, num_shards=3)
    else:
        _write_ids(tmp_path, num_examples=30, num_shards=3, name="r")
    info = data.inspect_records(str(tmp_path / "r-*"))

    def fresh_iterator():
        return iter(data.make_dataset(info, batch_size=8, training=True, seed=3, shuffle_buffer=16))

    # 6 batches of 8 cross the 30-example epoch: the file order and the buffer reshuffle on the way.
    uninterrupted = _take(fresh_iterator(), 6)
    interrupted = fresh_iterator()
    list(_take(interrupted, 3))
    path = tf.train.Checkpoint(iterator=interrupted).save(str(tmp_path / "ckpt" / "it"))
    restored = fresh_iterator()
    tf.train.Checkpoint(iterator=restored).restore(path).assert_consumed()
    for (want_x, want_y), (got_x, got_y) in zip(uninterrupted[3:], _take(restored, 3), strict=True):
        assert want_x.numpy().tobytes() == got_x.numpy().tobytes()
        np.testing.assert_array_equal(want_y, got_y)


def _take(iterator, count: int):
    return [next(iterator) for _ in range(count)]


def test_seed_fixes_the_batch_order(tmp_path):
    _write_ids(tmp_path)
    info = data.inspect_records(str(tmp_path / "ids-*"))

    def ids(seed: int) -> np.ndarray:
        dataset = data.make_dataset(info, batch_size=10, training=True, seed=seed, shuffle_buffer=20)
        return _collect(dataset, 8)[0][:, 0]

    np.testing.assert_array_equal(ids(1), ids(1))
    assert not np.array_equal(ids(1), ids(2))
    # Each epoch (4 batches of 10) holds every example once, and the two epochs are ordered differently.
    first, second = ids(1)[:40], ids(1)[40:]
    np.testing.assert_array_equal(np.sort(first), np.arange(40))
    np.testing.assert_array_equal(np.sort(second), np.arange(40))
    assert not np.array_equal(first, second)


@pytest.mark.parametrize("num_shards", [4, 3, 1])
def test_eval_worker_shards_are_disjoint_and_complete(tmp_path, num_shards):
    _write_ids(tmp_path, num_examples=41, num_shards=num_shards)
    info = data.inspect_records(str(tmp_path / "ids-*"))
    parts = [
        _collect(data.make_dataset(info, batch_size=8, training=False, worker_index=i, num_workers=2))[0][:, 0]
        for i in range(2)
    ]
    assert not set(parts[0]) & set(parts[1])
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(41))


def test_training_workers_read_their_own_files(tmp_path):
    _write_ids(tmp_path, num_examples=40, num_shards=4)  # 10 examples per file
    info = data.inspect_records(str(tmp_path / "ids-*"))
    for worker, want in ((0, [*range(0, 10), *range(20, 30)]), (1, [*range(10, 20), *range(30, 40)])):
        dataset = data.make_dataset(info, batch_size=5, training=True, worker_index=worker, num_workers=2)
        np.testing.assert_array_equal(np.sort(_collect(dataset, 4)[0][:, 0]), want)


def test_eval_keeps_order_and_short_last_batch(tmp_path):
    _write_ids(tmp_path, num_examples=10, num_shards=2)
    info = data.inspect_records(str(tmp_path / "ids-*"))
    dataset = data.make_dataset(info, batch_size=4, training=False)
    assert [x[:, 0].numpy().tolist() for x, _ in dataset] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    dropped = data.make_dataset(info, batch_size=4, training=False, drop_remainder=True)
    assert len(list(dropped)) == 2


# Errors.


def test_no_files_names_the_flag(tmp_path):
    for what in ("train_data", "--train_data"):
        with pytest.raises(data.DataError, match=r"^no files match --train_data pattern '.*nothing-\*'"):
            data.list_files(str(tmp_path / "nothing-*"), what=what)
    with pytest.raises(data.DataError, match="--eval_data is empty"):
        data.inspect_records(" , ", what="--eval_data")
    _write_ids(tmp_path, num_shards=2)
    with pytest.raises(data.DataError, match="typo"):
        data.list_files(f"{tmp_path / 'ids-*'},{tmp_path / 'typo-*'}")
    assert len(data.list_files(f"{tmp_path / 'ids-*'}, {tmp_path / 'ids-00000*'}")) == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (np.random.default_rng(0).bytes(100), "not a TFRecord file or is corrupt"),
        (b"", "holds no records"),
    ],
)
def test_bad_files_are_data_errors(tmp_path, content, message):
    (tmp_path / "bad.tfrecord").write_bytes(content)
    with pytest.raises(data.DataError, match=message) as error:
        data.inspect_records(str(tmp_path / "bad.tfrecord"))
    assert "bad.tfrecord" in str(error.value)


def test_record_that_is_not_an_example(tmp_path):
    with tf.io.TFRecordWriter(str(tmp_path / "text.tfrecord")) as writer:
        writer.write(b"just some text, not a protocol buffer")
    with pytest.raises(data.DataError, match=r"text.tfrecord is not a serialized tf.train.Example"):
        data.inspect_records(str(tmp_path / "text.tfrecord"))


def test_missing_and_unknown_keys(tmp_path):
    _write_ids(tmp_path, num_shards=1)
    with pytest.raises(data.DataError, match=r"key 'pixels' is missing .* keys found: features \(float_list\)"):
        data.inspect_records(str(tmp_path / "ids-*"), data.DenseSchema(feature_key="pixels"))
    with pytest.raises(data.DataError, match="'image/encoded' is missing"):
        data.inspect_records(str(tmp_path / "ids-*"), data.ImageSchema())
    data.write_dense_records(str(tmp_path / "odd"), np.zeros((2, 2)), np.zeros(2, int), feature_key="x")
    with pytest.raises(data.DataError, match=r"keys found: label \(int64_list\), x \(float_list\).*DenseSchema"):
        data.inspect_records(str(tmp_path / "odd-*"))


def test_undecodable_image(tmp_path):
    example = tf.train.Example()
    example.features.feature["image/encoded"].bytes_list.value.append(b"not an image")
    example.features.feature["image/class/label"].int64_list.value.append(1)
    with tf.io.TFRecordWriter(str(tmp_path / "x.tfrecord")) as writer:
        writer.write(example.SerializeToString())
    with pytest.raises(data.DataError, match="cannot decode 'image/encoded'.*JPEG or PNG"):
        data.inspect_records(str(tmp_path / "x.tfrecord"))


def test_bad_pipeline_arguments(tmp_path):
    _write_ids(tmp_path, num_shards=1)
    info = data.inspect_records(str(tmp_path / "ids-*"))
    with pytest.raises(data.DataError, match=r"1 file\(s\) match but training has 2 workers"):
        data.make_dataset(info, batch_size=4, training=True, num_workers=2)
    with pytest.raises(data.DataError, match=r"batch_size \(0\)"):
        data.make_dataset(info, batch_size=0, training=True)
    with pytest.raises(data.DataError, match=r"worker_index \(2\)"):
        data.make_dataset(info, batch_size=4, training=False, worker_index=2, num_workers=2)
    with pytest.raises(data.DataError, match="image_size"):
        data.ImageSchema(image_size=(0, 4))


def test_writer_validates_its_input(tmp_path):
    prefix = str(tmp_path / "w")
    with pytest.raises(data.DataError, match="dtype float64; expected uint8"):
        data.write_image_records(prefix, np.zeros((2, 3, 3, 1)), np.zeros(2, int))
    with pytest.raises(data.DataError, match=r"shape \(2, 3, 3\)"):
        data.write_image_records(prefix, np.zeros((2, 3, 3), np.uint8), np.zeros(2, int))
    with pytest.raises(data.DataError, match=r"labels have shape \(3,\)"):
        data.write_image_records(prefix, np.zeros((2, 3, 3, 1), np.uint8), np.zeros(3, int))
    with pytest.raises(data.DataError, match="image_format 'gif'"):
        data.write_image_records(prefix, np.zeros((2, 3, 3, 1), np.uint8), np.zeros(2, int), image_format="gif")
    with pytest.raises(data.DataError, match=r"num_shards \(3\)"):
        data.write_dense_records(prefix, np.zeros((2, 3)), np.zeros(2, int), num_shards=3)
    with pytest.raises(data.DataError, match="labels have dtype float64"):
        data.write_dense_records(prefix, np.zeros((2, 3)), np.zeros(2))
    assert not list(tmp_path.iterdir())


# Digits and `python -m data.prepare`.


@pytest.fixture(scope="module")
def digits_globs(tmp_path_factory):
    return data.ensure_digits(str(tmp_path_factory.mktemp("cache") / "digits-v1"))


def test_ensure_digits_builds_the_fixed_split(digits_globs):
    train_glob, eval_glob = digits_globs
    assert (_count_records(train_glob), _count_records(eval_glob)) == (1437, 360)
    assert len(data.list_files(train_glob)) == 4 and len(data.list_files(eval_glob)) == 1
    info = data.inspect_records(eval_glob)
    assert info.example_shape == (8, 8, 1) and info.schema == data.ImageSchema()
    features, labels = _collect(data.make_dataset(info, batch_size=100, training=False))
    assert set(labels.tolist()) == set(range(digits.NUM_CLASSES))
    assert features.min() == 0.0 and features.max() == 1.0
    (_, _), (eval_images, eval_labels) = digits.digits_splits()
    np.testing.assert_array_equal(labels, eval_labels)
    np.testing.assert_array_equal(features, eval_images / np.float32(255))
    with open(os.path.join(os.path.dirname(eval_glob), "info.json")) as f:
        assert json.load(f)["counts"] == {"train": 1437, "eval": 360}


def test_ensure_digits_second_call_is_a_cache_hit(digits_globs, monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # any import of sklearn now raises ImportError
    start = time.perf_counter()
    assert data.ensure_digits(os.path.dirname(digits_globs[0])) == digits_globs
    assert time.perf_counter() - start < 0.5
    leftovers = [name for name in os.listdir(os.path.dirname(os.path.dirname(digits_globs[0]))) if "building" in name]
    assert leftovers == []


def test_ensure_digits_loses_a_race_gracefully(tmp_path, monkeypatch):
    cache_dir = str(tmp_path / "digits-v1")
    write_digits = digits.write_digits

    def racing_write(out_dir):
        globs = write_digits(out_dir)
        shutil.copytree(out_dir, cache_dir)  # another process moves its copy into place first
        return globs

    monkeypatch.setattr(digits, "write_digits", racing_write)
    train_glob, eval_glob = data.ensure_digits(cache_dir)
    assert train_glob == os.path.join(cache_dir, "train-*-of-00004")
    assert _count_records(eval_glob) == 360
    assert os.listdir(tmp_path) == ["digits-v1"]  # the loser's build directory is gone


def test_ensure_digits_default_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TOWERFLOW_CACHE", str(tmp_path))
    assert digits.default_cache_dir() == str(tmp_path / "digits-v1")
    (tmp_path / "digits-v1").mkdir()
    (tmp_path / "digits-v1" / "stray").write_text("x")
    monkeypatch.setattr(digits, "write_digits", lambda out_dir: None)  # the build itself is tested above
    with pytest.raises(data.DataError, match="exists but is incomplete"):
        data.ensure_digits()


def _read_info(out_dir) -> dict:
    with open(os.path.join(out_dir, "info.json")) as f:
        return json.load(f)


def test_prepare_digits(tmp_path, capsys):
    assert prepare.main(["digits", str(tmp_path)]) == 0
    assert f"--train_data={tmp_path}/train-*-of-00004" in capsys.readouterr().out
    info = _read_info(tmp_path)
    assert (info["schema"], info["shape"], info["num_classes"]) == ("image", [8, 8, 1], 10)
    assert info["counts"] == {"train": _count_records(str(tmp_path / "train-*")), "eval": 360}


def test_prepare_synthetic_images(tmp_path):
    args = ["synthetic", str(tmp_path), "--shape=6,5,3", "--num_classes=3", "--num_examples=30", "--num_shards=2"]
    assert prepare.main([*args, "--image_format=jpeg"]) == 0
    info = _read_info(tmp_path)
    assert info["counts"] == {"train": 30, "eval": 6}
    assert (info["schema"], info["shape"], info["image_format"]) == ("image", [6, 5, 3], "jpeg")
    assert (_count_records(str(tmp_path / "train-*-of-00002")), _count_records(str(tmp_path / "eval-*"))) == (30, 6)
    record_info = data.inspect_records(str(tmp_path / "train-*"))
    assert record_info.example_shape == (6, 5, 3)
    labels = _collect(data.make_dataset(record_info, batch_size=30, training=False))[1]
    assert set(labels.tolist()) <= {0, 1, 2}


def test_prepare_synthetic_dense(tmp_path):
    assert prepare.main(["synthetic", str(tmp_path), "--shape=7", "--num_classes=4", "--num_examples=50"]) == 0
    info = _read_info(tmp_path)
    assert (info["schema"], info["shape"], info["counts"]) == ("dense", [7], {"train": 50, "eval": 10})
    record_info = data.inspect_records(str(tmp_path / "eval-*"))
    assert record_info.schema == data.DenseSchema() and record_info.example_shape == (7,)
    assert len(data.list_files(str(tmp_path / "train-*"))) == 4


@pytest.mark.parametrize(
    "bad", ["--shape=8,8", "--shape=8,8,2", "--shape=a", "--num_classes=0", "--num_shards=100", "--image_format=gif"]
)
def test_prepare_rejects_bad_arguments(tmp_path, capsys, bad):
    args = ["synthetic", str(tmp_path), "--shape=4,4,1", "--num_classes=2", "--num_examples=20", bad]
    with pytest.raises(SystemExit) as exit_info:
        prepare.main(args)
    assert exit_info.value.code == 2
    assert bad.split("=")[0] in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("shape", [(4, 4, 1), (10,)])
def test_synthetic_data_is_learnable(shape):
    (train_x, train_y), (eval_x, eval_y) = synthetic.synthetic_splits(shape, 5, 500, 200, seed=0)
    flat_train = train_x.reshape(len(train_x), -1).astype(np.float32)
    centroids = np.stack([flat_train[train_y == k].mean(axis=0) for k in range(5)])
    flat_eval = eval_x.reshape(len(eval_x), -1).astype(np.float32)
    predictions = np.argmin(((flat_eval[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (predictions == eval_y).mean() > 0.9


def test_schema_and_prepare_import_without_tensorflow():
    """`python -m data.prepare` must reject bad arguments before the slow TensorFlow import."""
    code = "import sys, data, data.prepare; from data import DataError; assert 'tensorflow' not in sys.modules"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)
