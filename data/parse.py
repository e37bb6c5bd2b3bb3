"""Parsing batches of serialized tf.train.Examples into (features, labels), for the pipeline and the checks."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from data import augment as augment_lib
from data import schema as schema_lib
from data.schema import DenseSchema, ImageSchema, Preprocess, RecordInfo

# Images of one batch decoded concurrently; the loop overhead, not the decoding, limits small images.
_PARALLELISM = 32


def batch_parser(
    info: RecordInfo,
    num_classes: int | None,
    decode: bool = True,
    *,
    preprocess: Preprocess | None = None,
    training: bool = False,
    stream_key: tf.Tensor | None = None,
):
    """Returns `parse(serialized [B] string, positions [B, 2] int64 = None) -> (features, labels int32 [B])`.

    Images become float32 [B, H, W, C]: pixels in [0, 1], augmented when `training` (`data.augment`, each
    example keyed on `stream_key` and its (epoch, record) position), then normalized; dense records float32
    [B, D]. Parsing fails (a `tf.errors.InvalidArgumentError` naming no record) on a record that is not an
    Example, lacks a key, holds an image that does not decode or has another size than the first record
    (without image_size), or whose label after label_offset is outside [0, num_classes).

    Args:
        info: The schema and the example shape.
        num_classes: Bound of the label check; None: unchecked.
        decode: False skips decoding images (the features are then the encoded strings): a cheap check.
        preprocess: Augmentation (training only) and normalization of images; None: neither.
        training: Whether to augment (then `parse` needs the positions).
        stream_key: The input stream's key (`data.augment.stream_key`); needed to augment.
    """
    if isinstance(info.schema, DenseSchema):
        return _dense_parser(info.schema, info.example_shape, num_classes)
    preprocess = preprocess or Preprocess()
    random = _is_random(preprocess, training, stream_key)
    images_of = _per_image(_image_loader(info.schema, info.example_shape, preprocess.augment, random), info)
    finish = _finisher(preprocess, random, stream_key)
    spec = {
        schema_lib.IMAGE_ENCODED_KEY: tf.io.FixedLenFeature([], tf.string),
        schema_lib.IMAGE_LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(serialized: tf.Tensor, positions: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        example = tf.io.parse_example(serialized, spec)
        labels = _labels(example[schema_lib.IMAGE_LABEL_KEY], info.schema.label_offset, num_classes)
        encoded = example[schema_lib.IMAGE_ENCODED_KEY]
        if not decode:
            return encoded, labels
        return finish(images_of, encoded, positions), labels

    return parse


def cached_parser(records, info: RecordInfo, preprocess: Preprocess, stream_key: tf.Tensor):
    """Returns `parse(ids [B] int64, positions [B, 2] int64) -> (features, labels)` over decoded `records` (a
    `data.cache.DecodedRecords`, which is built with this module's `raw_image_parser`: so not imported here):
    the values `batch_parser(..., training=True)` gives for the same records, without parsing or decoding."""
    random = _is_random(preprocess, True, stream_key)
    load = _image_loader(info.schema, info.example_shape, preprocess.augment, random, records)
    finish = _finisher(preprocess, random, stream_key)
    if records.images is None or preprocess.augment == "imagenet" or info.schema.image_size is not None:
        images_of = _per_image(load, info)
    else:  # every image has the example shape: one gather reads the batch, then only the random steps run

        def images_of(ids, keys, scale):
            images = tf.cast(tf.gather(records.images, ids), tf.float32)
            if random:
                images = _map_images(
                    lambda args: augment_lib.randomize(args[0], preprocess.augment, args[1]), images, keys
                )
            return scale(images)

    return lambda ids, positions: (finish(images_of, ids, positions), tf.gather(records.labels, ids))


def raw_image_parser(info: RecordInfo, num_classes: int | None):
    """Returns `parse(serialized [B]) -> (pixels uint8, shapes int32 [B, 3], labels int32 [B])` for the
    cache: every image decoded at its stored size, its bytes end to end in `pixels`."""
    channels = info.example_shape[-1]
    parse = batch_parser(info, num_classes, decode=False)

    def decode(encoded):
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        return tf.reshape(image, [-1]), tf.shape(image)

    def parse_raw(serialized):
        encoded, labels = parse(serialized)
        signature = (tf.RaggedTensorSpec([None], tf.uint8, ragged_rank=0), tf.TensorSpec([3], tf.int32))
        pixels, shapes = tf.map_fn(decode, encoded, fn_output_signature=signature, parallel_iterations=_PARALLELISM)
        return pixels.flat_values, shapes, labels

    return parse_raw


def serving_images(info: RecordInfo, preprocess: Preprocess):
    """`images(encoded [B] string) -> float32 [B, H, W, C]`: each image as eval's `batch_parser` makes it from
    the same bytes (decoded; eval's central crop under imagenet augmentation; resized bilinear to (H, W);
    [0, 1]; normalized), but of any size: bilinear resizing to the same size is the identity (bitwise), so
    resizing every image matches eval's records and lets clients send other sizes. For the serving export."""
    images_of, finish = _eval_images(info, preprocess)
    return lambda encoded: finish(images_of, encoded, None)


def decoded_images(info: RecordInfo, preprocess: Preprocess, scale: float = 1.0):
    """`images(pixels [B, H, W, C]) -> float32 [B, H, W, C]`: eval's steps after its decoder, applied to
    images decoded already at the example's (H, W): `pixels * scale` as [0, 255] values, eval's central crop
    under imagenet augmentation, resized bilinear to (H, W) (the identity otherwise, bitwise), [0, 1],
    normalized. scale: 1 for uint8 pixels, 255 for pixel / 255 floats (k / 255 * 255 == k in float32, so
    both give eval's values). For the serving export's predict_uint8 and predict_float."""
    images_of, finish = _eval_images(info, preprocess, _Decoded())
    return lambda pixels: finish(images_of, tf.cast(pixels, tf.float32) * scale, None)


class _Decoded:
    """Stands in for `DecodedRecords` in `_image_loader` when each source is an image already decoded."""

    images = None

    def image(self, source: tf.Tensor) -> tf.Tensor:
        return source


def _eval_images(info: RecordInfo, preprocess: Preprocess, records=None):
    """(images_of, finish) of eval's pipeline, resizing every image to the example's (H, W)."""
    schema = dataclasses.replace(info.schema, image_size=info.example_shape[:2])
    load = _image_loader(schema, info.example_shape, preprocess.augment, random=False, records=records)
    return _per_image(load, info), _finisher(preprocess, False, None)


def _is_random(preprocess: Preprocess, training: bool, stream_key) -> bool:
    random = training and preprocess.augment != "none"
    if random and stream_key is None:
        raise ValueError("augmenting training images needs the stream_key their random steps are keyed on")
    return random


def _finisher(preprocess: Preprocess, random: bool, stream_key):
    """`finish(images_of, sources, positions)`: each example's key, then the images from `images_of(sources,
    keys, scale)`, `scale` taking images in [0, 255] to [0, 1], normalized."""
    normalize = augment_lib.normalizer(preprocess.mean, preprocess.std)

    def finish(images_of, sources, positions):
        if random:
            keys = augment_lib.example_keys(stream_key, positions)
        else:
            keys = tf.zeros([tf.shape(sources)[0], 2], tf.int64)
        return images_of(sources, keys, lambda images: normalize(images / 255.0))

    return finish


def _map_images(fn, sources, keys):
    return tf.map_fn(fn, (sources, keys), fn_output_signature=tf.float32, parallel_iterations=_PARALLELISM)


def _per_image(load, info: RecordInfo):
    # Each image is scaled as it is made, while in cache: scaling the batch after it is stacked is one more
    # pass over all its pixels in memory (~40 us of a core per 224x224 image). Elementwise: the same bits.
    def images_of(sources, keys, scale):
        images = _map_images(lambda args: scale(load(args[0], args[1])), sources, keys)
        return tf.ensure_shape(images, [None, *info.example_shape])

    return images_of


def _image_loader(schema: ImageSchema, shape: tuple[int, ...], augment: str, random: bool, records=None):
    """`load(source, key) -> float32 [H, W, C] in [0, 255]`: one image decoded from its encoded bytes (or
    taken from decoded `records` by id), cropped and resized, and its random steps applied when `random`."""
    height, width, channels = shape
    mismatch = (
        f"an image is not {height}x{width}x{channels} like the first record; pass --image_size=H,W "
        "(ImageSchema.image_size) to resize every image to one size"
    )

    def decode(source):
        if records is not None:
            return records.image(source)
        return tf.io.decode_image(source, channels=channels, expand_animations=False)

    def to_size(image):
        if schema.image_size is not None:
            return augment_lib.resize(image, schema.image_size)
        check = tf.debugging.assert_equal(tf.shape(image)[:2], [height, width], message=mismatch)
        with tf.control_dependencies([check]):
            return tf.cast(tf.ensure_shape(image, shape), tf.float32)

    def crop_resized(source, key):
        window_of = augment_lib.random_window(key) if random else augment_lib.center_window
        if records is None:
            cropped = augment_lib.decode_crop(source, window_of, channels)
        else:
            image = records.image(source)
            cropped = augment_lib.crop(image, window_of(tf.shape(image)))
        return tf.ensure_shape(augment_lib.resize(cropped, (height, width)), shape)

    def load(source, key):
        image = crop_resized(source, key) if augment == "imagenet" else to_size(decode(source))
        return augment_lib.randomize(image, augment, key) if random else image

    return load


def _dense_parser(schema: DenseSchema, shape: tuple[int, ...], num_classes: int | None):
    spec = {
        schema.feature_key: tf.io.FixedLenFeature(list(shape), tf.float32),
        schema.label_key: tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(serialized: tf.Tensor, positions: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        del positions  # dense records are never augmented
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
