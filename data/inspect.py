"""What a set of TFRecord files holds: find the files, read the first record, tell its schema and the example shape.

The pipelines (`data.pipeline`) take the `RecordInfo` this returns; nothing here reads more than one record.
"""

from __future__ import annotations

import tensorflow as tf
from google.protobuf import message as protobuf_message

from data import schema as schema_lib
from data.options import with_run_options
from data.schema import DataError, DenseSchema, ImageSchema, RecordInfo
from data.text import TOKENS_KEY


def list_files(pattern: str, *, what: str = "data") -> tuple[str, ...]:
    """Expands a glob, or several globs separated by commas, into a sorted, deduplicated list of files.

    Args:
        pattern: e.g. "/data/train-*" or "/a/train-*,/b/train-*". Any path TensorFlow's gfile reads.
        what: The flag the pattern came from, for error messages ("train_data" or "--train_data").

    Returns:
        The matching files, sorted.

    Raises:
        DataError: If the pattern is empty or any of its comma-separated globs matches nothing (a typo in
            one part would otherwise silently drop part of the data).
    """
    flag = "--" + what.lstrip("-")
    globs = [part.strip() for part in pattern.split(",") if part.strip()]
    if not globs:
        raise DataError(f"{flag} is empty; pass a file glob such as '/data/train-*'")
    files: set[str] = set()
    for glob in globs:
        try:
            matches = tf.io.gfile.glob(glob)
        except tf.errors.NotFoundError:
            matches = []
        if not matches:
            raise DataError(f"no files match {flag} pattern '{glob}'; check the path (full pattern: '{pattern}')")
        files.update(matches)
    return tuple(sorted(files))


def inspect_records(pattern: str, schema: ImageSchema | DenseSchema | None = None, *, what: str = "data") -> RecordInfo:
    """Finds the files and reads their first record to resolve the schema and the example shape.

    Args:
        pattern: File glob(s), as for `list_files`.
        schema: The expected schema; None auto-detects it (image/encoded present -> ImageSchema(), else a
            float_list "features" with an int64 "label" -> DenseSchema()).
        what: The flag the pattern came from, for error messages ("train_data" or "--train_data").

    Returns:
        A RecordInfo with the resolved schema, the example shape and the files.

    Raises:
        DataError: If no file matches, the first file is empty, not a TFRecord file or corrupt, its first
            record is not a tf.train.Example, a key of the schema is missing, or the image cannot be decoded.
    """
    files = list_files(pattern, what=what)
    features = read_first_example(files[0]).features.feature
    if schema is None:
        schema = _detect_schema(features, files[0])
    _check_keys(schema, features, files[0])
    if isinstance(schema, ImageSchema):
        shape = _image_shape(schema, features, files[0])
    else:
        shape = _dense_shape(schema, features, files[0])
    return RecordInfo(schema=schema, example_shape=shape, files=files)


def read_first_example(path: str) -> tf.train.Example:
    try:
        records = list(with_run_options(tf.data.TFRecordDataset(path).take(1)))
    except tf.errors.DataLossError as e:
        raise DataError(f"{path} is not a TFRecord file or is corrupt ({e.message.strip()})") from e
    if not records:
        raise DataError(f"{path} holds no records; remove it from the pattern or rewrite it")
    try:
        return tf.train.Example.FromString(records[0].numpy())
    except protobuf_message.DecodeError as e:
        raise DataError(f"the first record of {path} is not a serialized tf.train.Example ({e})") from e


def _kind(feature: tf.train.Feature) -> str | None:
    return feature.WhichOneof("kind")


def _describe_keys(features) -> str:
    if not features:
        return "no features"
    return "keys found: " + ", ".join(f"{key} ({_kind(features[key])})" for key in sorted(features))


def _detect_schema(features, path: str) -> ImageSchema | DenseSchema:
    if schema_lib.IMAGE_ENCODED_KEY in features:
        return ImageSchema()
    dense = DenseSchema()
    if (
        dense.feature_key in features
        and _kind(features[dense.feature_key]) == "float_list"
        and dense.label_key in features
    ):
        return dense
    if set(features) == {TOKENS_KEY} and _kind(features[TOKENS_KEY]) == "int64_list":
        raise DataError(
            f"{path} holds the language model's token records (one int64 list '{TOKENS_KEY}', `python -m "
            "data.prepare text`), not images or vectors with class labels; did you mean --task=lm?"
        )
    raise DataError(
        f"cannot tell the schema of {path}: {_describe_keys(features)}. ImageSchema needs "
        f"'{schema_lib.IMAGE_ENCODED_KEY}' and '{schema_lib.IMAGE_LABEL_KEY}'; DenseSchema needs a float_list "
        f"'{dense.feature_key}' and an int64 '{dense.label_key}' (for other keys pass --feature_key and "
        "--label_key; in Python, DenseSchema(feature_key=..., label_key=...))"
    )


def _check_keys(schema: ImageSchema | DenseSchema, features, path: str) -> None:
    if isinstance(schema, ImageSchema):
        required = {schema_lib.IMAGE_ENCODED_KEY: "bytes_list", schema_lib.IMAGE_LABEL_KEY: "int64_list"}
    else:
        required = {schema.feature_key: "float_list", schema.label_key: "int64_list"}
    for key, kind in required.items():
        if key not in features:
            raise DataError(
                f"{type(schema).__name__} key '{key}' is missing from the first record of {path}; "
                f"{_describe_keys(features)}"
            )
        if _kind(features[key]) != kind:
            raise DataError(
                f"key '{key}' in {path} holds a {_kind(features[key])}, but {type(schema).__name__} needs a {kind}"
            )


def _image_shape(schema: ImageSchema, features, path: str) -> tuple[int, int, int]:
    keys = (schema_lib.IMAGE_HEIGHT_KEY, schema_lib.IMAGE_WIDTH_KEY, schema_lib.IMAGE_CHANNELS_KEY)
    if all(key in features and features[key].int64_list.value for key in keys):
        height, width, channels = (int(features[key].int64_list.value[0]) for key in keys)
    else:
        # Not every writer stores the dimensions (they are optional in the ImageNet scripts): decode.
        encoded = features[schema_lib.IMAGE_ENCODED_KEY].bytes_list.value[0]
        try:
            image = tf.io.decode_image(encoded, expand_animations=False)
        except tf.errors.InvalidArgumentError as e:
            raise DataError(
                f"cannot decode '{schema_lib.IMAGE_ENCODED_KEY}' of the first record of {path} as an "
                f"image; it must hold JPEG or PNG bytes ({e.message.strip()})"
            ) from e
        height, width, channels = (int(v) for v in image.shape)
    if schema.image_size is not None:
        height, width = schema.image_size
    return (height, width, channels)


def _dense_shape(schema: DenseSchema, features, path: str) -> tuple[int]:
    size = len(features[schema.feature_key].float_list.value)
    if size == 0:
        raise DataError(f"feature '{schema.feature_key}' of the first record of {path} is empty")
    return (size,)
