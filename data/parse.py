"""Parsing batches of serialized tf.train.Examples into (features, labels), for the pipeline and the checks."""

from __future__ import annotations

import tensorflow as tf

from data import schema as schema_lib
from data.schema import DenseSchema, ImageSchema, RecordInfo

# Images of one batch decoded concurrently; the loop overhead, not the decoding, limits small images.
_DECODE_PARALLELISM = 32


def batch_parser(info: RecordInfo, num_classes: int | None, decode: bool = True):
    """Returns `parse(serialized [B] string) -> (features, labels int32 [B])` for `info`'s schema.

    Images become float32 [B, H, W, C] in [0, 1]; dense records float32 [B, D]. Parsing fails (a
    `tf.errors.InvalidArgumentError` naming no record) on a record that is not an Example, lacks a key, holds
    an image that does not decode or has another size than the first record (without image_size), or
    whose label after label_offset is outside [0, num_classes).

    Args:
        info: The schema and the example shape.
        num_classes: Bound of the label check; None: unchecked.
        decode: False skips decoding images (the features are then the encoded strings): a cheap check.
    """
    if isinstance(info.schema, DenseSchema):
        return _dense_parser(info.schema, info.example_shape, num_classes)
    return _image_parser(info.schema, info.example_shape, num_classes, decode)


def _image_parser(schema: ImageSchema, shape: tuple[int, ...], num_classes: int | None, decode: bool):
    height, width, channels = shape
    spec = {
        schema_lib.IMAGE_ENCODED_KEY: tf.io.FixedLenFeature([], tf.string),
        schema_lib.IMAGE_LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
    }
    mismatch = (
        f"an image is not {height}x{width}x{channels} like the first record; pass --image_size=H,W "
        "(ImageSchema.image_size) to resize every image to one size"
    )

    def decode_one(encoded: tf.Tensor) -> tf.Tensor:
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        if schema.image_size is not None:
            return tf.image.resize(image, schema.image_size, method="bilinear")
        check = tf.debugging.assert_equal(tf.shape(image)[:2], [height, width], message=mismatch)
        with tf.control_dependencies([check]):
            return tf.cast(tf.ensure_shape(image, shape), tf.float32)

    def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        example = tf.io.parse_example(serialized, spec)
        labels = _labels(example[schema_lib.IMAGE_LABEL_KEY], schema.label_offset, num_classes)
        if not decode:
            return example[schema_lib.IMAGE_ENCODED_KEY], labels
        images = tf.map_fn(
            decode_one,
            example[schema_lib.IMAGE_ENCODED_KEY],
            fn_output_signature=tf.TensorSpec(shape, tf.float32),
            parallel_iterations=_DECODE_PARALLELISM,
        )
        return images / 255.0, labels

    return parse


def _dense_parser(schema: DenseSchema, shape: tuple[int, ...], num_classes: int | None):
    spec = {
        schema.feature_key: tf.io.FixedLenFeature(list(shape), tf.float32),
        schema.label_key: tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        example = tf.io.parse_example(serialized, spec)
        return example[schema.feature_key], _labels(example[schema.label_key], schema.label_offset, num_classes)

    return parse


def _labels(stored: tf.Tensor, label_offset: int, num_classes: int | None) -> tf.Tensor:
    """int32 labels, checked in the input pipeline (on the host) whatever the towers' device: on GPU, sparse
    cross-entropy turns a label outside [0, num_classes) into NaN instead of an error. One reduction per
    batch; the record and its label are named later by data.check, which re-reads the data."""
    labels = stored - label_offset
    if num_classes is not None:
        in_range = tf.reduce_all(tf.logical_and(labels >= 0, labels < num_classes))
        check = tf.debugging.Assert(in_range, [f"a label is outside [0, num_classes={num_classes})"])
        with tf.control_dependencies([check]):
            labels = tf.identity(labels)
    return tf.cast(labels, tf.int32)
