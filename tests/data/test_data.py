"""Tests of data/: schemas, the reader pipeline and the writer (digits and prepare: test_data_prepare.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import data
from tests.support.records import _collect, _images, _write_ids

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


def test_more_training_workers_than_files_share_records_of_one_file(tmp_path):
    """5 workers on 2 files: workers 0, 2, 4 share file 0 (every 3rd record each), 1 and 3 share file 1."""
    _write_ids(tmp_path, num_examples=30, num_shards=2)  # file 0: ids 0-14, file 1: ids 15-29
    info = data.inspect_records(str(tmp_path / "ids-*"))
    seen = []
    for worker, share in {0: 5, 1: 8, 2: 5, 3: 7, 4: 5}.items():  # records per epoch
        dataset = data.make_dataset(info, batch_size=1, training=True, worker_index=worker, num_workers=5)
        ids = _collect(dataset, share)[0][:, 0].tolist()
        assert len(set(ids)) == share, (worker, ids)
        seen += ids
    assert sorted(seen) == list(range(30))  # every record read by exactly one worker, none twice


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


def test_training_pipeline_resumes_exactly_from_the_position_its_batches_carry(tmp_path):
    _write_ids(tmp_path, num_examples=40, num_shards=3)
    info = data.inspect_records(str(tmp_path / "ids-*"))

    def batches(start, count):
        dataset = data.make_dataset(info, batch_size=3, training=True, seed=5, shuffle_buffer=8, resume_from=start)
        return [(x[:, 0].numpy().tolist(), position.numpy().tolist()) for x, _, position in dataset.take(count)]

    full = batches((0, 0), 40)  # 120 records: three epochs of 40
    assert [p for _, p in full[:3]] == [[0, 3], [0, 6], [0, 9]]
    assert full[13][1] == [1, 2]  # records 39..41: the last of epoch 0, then two of epoch 1
    records = sum((ids for ids, _ in full), [])
    epoch0, epoch1 = records[:40], records[40:80]
    assert sorted(epoch0) == sorted(epoch1) == list(range(40))  # every record once per epoch
    assert epoch0 != epoch1  # in a new order
    for cut in (1, 13, 14, 20, 27):
        assert batches(tuple(full[cut - 1][1]), 10) == full[cut : cut + 10], cut


@pytest.mark.quick
def test_token_records_read_as_labeled_records_suggest_the_language_model(tmp_path):
    """Records of one int64 list `tokens` (`python -m data.prepare text`) read without --task=lm: the message
    says what they are and what to pass, not which Python schema class to construct."""
    schema = data.FeatureSchema.of({"tokens": data.Feature("int64", max_length=4)}, "lm")
    data.write_feature_records(str(tmp_path / "train-00000-of-00001.tfrecord"), [{"tokens": [1, 2, 3]}], schema)
    with pytest.raises(data.DataError) as refused:
        data.inspect_records(str(tmp_path / "train-*"))
    assert str(refused.value) == (
        f"{tmp_path}/train-00000-of-00001.tfrecord holds the language model's token records (one int64 list "
        "'tokens', `python -m data.prepare text`), not images or vectors with class labels; did you mean --task=lm?"
    )
