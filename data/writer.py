"""Writing numpy arrays as sharded TFRecord files in the schemas `data.inspect` recognises, and a task's own
feature records (`data.FeatureSchema`) as one file."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import numpy as np
import tensorflow as tf

from data import schema as schema_lib
from data.schema import DataError, Feature, FeatureSchema

_IMAGE_FORMATS = ("png", "jpeg")
_COLORSPACES = {1: b"Grayscale", 3: b"RGB"}


def shard_paths(path_prefix: str, num_shards: int) -> list[str]:
    """Returns the file names `{path_prefix}-{i:05d}-of-{num_shards:05d}` for every shard i."""
    return [f"{path_prefix}-{i:05d}-of-{num_shards:05d}" for i in range(num_shards)]


def write_image_records(
    path_prefix: str,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    num_shards: int = 1,
    image_format: str = "png",
    label_offset: int = 0,
) -> list[str]:
    """Writes images as ImageNet-style tf.train.Examples (the keys of build_imagenet_data.py).

    Each record holds image/encoded, image/format (b"PNG" or b"JPEG"), image/class/label (label +
    label_offset), image/height, image/width, image/channels and image/colorspace (b"RGB" or b"Grayscale").
    Examples are dealt CONTIGUOUSLY: shard i holds examples [i*N//S, (i+1)*N//S), so reading the shards in
    order gives the input order back.

    Args:
        path_prefix: Files are named `{path_prefix}-{i:05d}-of-{num_shards:05d}`; missing directories are made.
        images: uint8 array (N, H, W, C) with C = 1 (grayscale) or 3 (RGB).
        labels: Integer array (N,).
        num_shards: Number of files, in [1, N].
        image_format: "png" (lossless) or "jpeg" (quality 95, lossy).
        label_offset: Added to every stored label (1 mimics ImageNet's 1-based labels).

    Returns:
        The paths written, in shard order.

    Raises:
        DataError: For a bad shape, dtype, format or shard count.
    """
    if image_format not in _IMAGE_FORMATS:
        raise DataError(f"image_format '{image_format}' must be one of {', '.join(_IMAGE_FORMATS)}")
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[-1] not in _COLORSPACES:
        raise DataError(f"images have shape {images.shape}; expected (N, H, W, C) with C = 1 or 3")
    if images.dtype != np.uint8:
        raise DataError(f"images have dtype {images.dtype}; expected uint8 (scale to 0..255 and cast)")
    labels = _check_labels(labels, len(images))
    _check_num_shards(num_shards, len(images))
    height, width, channels = images.shape[1:]
    encode = tf.io.encode_png if image_format == "png" else tf.io.encode_jpeg
    header = {
        schema_lib.IMAGE_FORMAT_KEY: _bytes_feature(image_format.upper().encode()),
        schema_lib.IMAGE_HEIGHT_KEY: _int64_feature([height]),
        schema_lib.IMAGE_WIDTH_KEY: _int64_feature([width]),
        schema_lib.IMAGE_CHANNELS_KEY: _int64_feature([channels]),
        schema_lib.IMAGE_COLORSPACE_KEY: _bytes_feature(_COLORSPACES[channels]),
    }

    def serialize(index: int) -> bytes:
        feature = dict(header)
        feature[schema_lib.IMAGE_ENCODED_KEY] = _bytes_feature(encode(images[index]).numpy())
        feature[schema_lib.IMAGE_LABEL_KEY] = _int64_feature([int(labels[index]) + label_offset])
        return _example(feature)

    return _write_shards(path_prefix, num_shards, len(images), serialize)


def write_dense_records(
    path_prefix: str,
    features: np.ndarray,
    labels: np.ndarray,
    *,
    num_shards: int = 1,
    feature_key: str = "features",
    label_key: str = "label",
) -> list[str]:
    """Writes feature vectors as tf.train.Examples with a float_list and an int64 label.

    Examples are dealt contiguously across shards, as in `write_image_records`.

    Args:
        path_prefix: Files are named `{path_prefix}-{i:05d}-of-{num_shards:05d}`; missing directories are made.
        features: Floating-point array (N, D), stored as float32.
        labels: Integer array (N,).
        num_shards: Number of files, in [1, N].
        feature_key: Key of the feature vector.
        label_key: Key of the label.

    Returns:
        The paths written, in shard order.

    Raises:
        DataError: For a bad shape, dtype, key or shard count.
    """
    features = np.asarray(features)
    if features.ndim != 2 or features.shape[1] < 1:
        raise DataError(f"features have shape {features.shape}; expected (N, D) with D >= 1")
    if not np.issubdtype(features.dtype, np.floating):
        raise DataError(f"features have dtype {features.dtype}; expected a float dtype (use .astype(np.float32))")
    if not feature_key or not label_key or feature_key == label_key:
        raise DataError(f"feature_key '{feature_key}' and label_key '{label_key}' must be distinct and non-empty")
    labels = _check_labels(labels, len(features))
    _check_num_shards(num_shards, len(features))
    features = features.astype(np.float32)

    def serialize(index: int) -> bytes:
        return _example(
            {
                feature_key: tf.train.Feature(float_list=tf.train.FloatList(value=features[index])),
                label_key: _int64_feature([int(labels[index])]),
            }
        )

    return _write_shards(path_prefix, num_shards, len(features), serialize)


def write_feature_records(path: str, examples: Iterable[dict], schema: FeatureSchema) -> int:
    """Writes one TFRecord file of tf.train.Examples holding `schema`'s features, in the order given.

    Args:
        path: The file; missing directories are made.
        examples: {key: list or np.ndarray} per example, with exactly the schema's keys: a fixed feature
            holds prod(shape) values (any shape of them), a variable-length one up to its max_length values.
        schema: The task's record schema.

    Returns:
        The number of records written.

    Raises:
        DataError: For a missing or unknown key, or a value count the schema does not allow.
    """
    features = schema.as_dict()
    directory = os.path.dirname(path)
    if directory:
        tf.io.gfile.makedirs(directory)
    count = 0
    with tf.io.TFRecordWriter(path) as writer:
        for count, example in enumerate(examples, start=1):
            if set(example) != set(features):
                raise DataError(
                    f"task '{schema.task}': example {count - 1} has keys {sorted(example)}, the schema "
                    f"{sorted(features)}"
                )
            writer.write(_example({key: _feature(schema.task, key, f, example[key]) for key, f in features.items()}))
    return count


def _feature(task: str, key: str, feature: Feature, value) -> tf.train.Feature:
    """One value of a feature record, its number of values checked against the schema."""
    values = np.asarray(value).reshape(-1)
    expected = int(np.prod(feature.shape))
    if (feature.variable and len(values) > feature.max_length) or (not feature.variable and len(values) != expected):
        bound = f"at most {feature.max_length}" if feature.variable else f"{expected} (shape {feature.shape})"
        raise DataError(f"task '{task}': feature '{key}' has {len(values)} values, the schema allows {bound}")
    if feature.dtype == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values.astype(np.int64)))
    if feature.dtype == "float32":
        return tf.train.Feature(float_list=tf.train.FloatList(value=values.astype(np.float32)))
    strings = [v if isinstance(v, bytes) else str(v).encode() for v in values.tolist()]
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=strings))


def _check_labels(labels: np.ndarray, num_examples: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.shape != (num_examples,):
        raise DataError(f"labels have shape {labels.shape}; expected ({num_examples},), one per example")
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"labels have dtype {labels.dtype}; expected an integer dtype (use .astype(np.int64))")
    return labels


def _check_num_shards(num_shards: int, num_examples: int) -> None:
    # An empty shard would be an empty file, which readers reject; so every shard gets an example.
    if not 1 <= num_shards <= num_examples:
        raise DataError(f"num_shards ({num_shards}) must be in [1, number of examples = {num_examples}]")


def _write_shards(path_prefix: str, num_shards: int, num_examples: int, serialize: Callable[[int], bytes]) -> list[str]:
    paths = shard_paths(path_prefix, num_shards)
    directory = os.path.dirname(path_prefix)
    if directory:
        tf.io.gfile.makedirs(directory)
    for shard, path in enumerate(paths):
        indices = range(shard * num_examples // num_shards, (shard + 1) * num_examples // num_shards)
        _write_file(path, (serialize(i) for i in indices))
    return paths


def _write_file(path: str, records: Iterable[bytes]) -> None:
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)


def _example(feature: dict[str, tf.train.Feature]) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _bytes_feature(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int64_feature(values: list[int]) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))
