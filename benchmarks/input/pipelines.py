"""The pipelines `python -m benchmarks --input` times: each yields batches of images, from the same JPEGs.

(a) `decode`: the ceiling. A tight tf.data map over the encoded bytes held in memory doing only
    `tf.io.decode_jpeg`: no file reading, parsing, resizing, casting or randomness.
(b) `towerflow_none` and (c) `towerflow_imagenet`: towerflow's training pipeline, `data.make_dataset(info,
    training=True)` as the trainer builds it for `--image_size=224,224` with `--augment=none` (decode whole,
    resize) or `--augment=imagenet` (random-resized crop, only the crop decoded, flip). Files are read (from
    the page cache), shuffled, parsed, scaled to [0, 1].
(d) `whole_then_crop` and (e) `crop_decode`: the imagenet augmentation alone on the bytes in memory,
    decoding the whole image then cropping (d), or only the crop with `decode_and_crop_jpeg` (e); (e)/(d) is
    what decoding only the crop saves.

SMALL_PIPELINES run on the 32x32x3 PNG records of the resnet20-synth benchmark setting, through the same
`data.make_dataset` with each --augment kind: decoded once into memory as --cache=auto does for them (`cached`,
what `augment_vs_none` trains on), or read and decoded from the files every epoch (`files`, --cache=none).
Each kind's per-image cost minus that of `none` in the same pipeline is what the augmentation costs.
"""

from __future__ import annotations

import tensorflow as tf

import data
from data import augment as augment_lib
from data.options import with_run_options
from data.parse import batch_parser

IMAGE_SIZE = (224, 224)
_SEED = 0

# name -> (row label, what it measures)
PIPELINES = {
    "decode": ("(a) decode_jpeg alone", "tf.io.decode_jpeg over the encoded bytes in memory"),
    "towerflow_none": ("(b) towerflow, no augment", "data.make_dataset, --augment=none, resize to 224x224"),
    "towerflow_imagenet": ("(c) towerflow, imagenet", "data.make_dataset, --augment=imagenet (crop decode), 224"),
    "whole_then_crop": ("(d) decode whole + crop", "in memory: decode_jpeg, random crop, resize 224, flip"),
    "crop_decode": ("(e) crop decode + crop", "in memory: decode_and_crop_jpeg, random crop, resize 224, flip"),
}


# name -> (row label, what it measures); every name is "small_<cache>_<augment>"
SMALL_PIPELINES = {
    "small_cached_none": ("(f) 32x32 cached, none", "data.make_dataset, decoded in memory, --augment=none"),
    "small_cached_flip": ("(g) 32x32 cached, flip", "the same, --augment=flip"),
    "small_cached_crop_flip": ("(h) 32x32 cached, crop_flip", "the same, --augment=crop_flip (resnet20's auto)"),
    "small_files_none": ("(i) 32x32 files, none", "data.make_dataset, PNG read and decoded, --augment=none"),
    "small_files_crop_flip": ("(j) 32x32 files, crop_flip", "the same, --augment=crop_flip"),
}


def small(name: str, pattern: str, batch_size: int, one_core: bool) -> tf.data.Dataset:
    """Small pipeline `name` (a key of SMALL_PIPELINES) over the records of `pattern`, repeating forever."""
    cache, augment = name.removeprefix("small_").split("_", 1)
    info = data.inspect_records(pattern)
    decoded = data.decode_share(info) if cache == "cached" else None
    dataset = data.make_dataset(
        info, batch_size=batch_size, training=True, seed=_SEED, preprocess=data.Preprocess(augment), cache=decoded
    )
    return dataset.map(lambda images, labels: images).with_options(thread_options(one_core))


def thread_options(one_core: bool) -> tf.data.Options:
    """tf.data options for one core (one thread for the whole pipeline, no intra-op parallelism) or all."""
    options = tf.data.Options()
    if one_core:
        options.threading.private_threadpool_size = 1
        options.threading.max_intra_op_parallelism = 1
    return options


def load_encoded(pattern: str) -> tf.Tensor:
    """The image/encoded bytes of every record matching `pattern`, in file order: string [N]."""
    info = data.inspect_records(pattern)
    parse = batch_parser(info, None, decode=False)
    records = tf.data.TFRecordDataset(list(info.files)).batch(1024)
    return tf.concat([parse(batch)[0] for batch in records], axis=0)


def build(name: str, pattern: str, encoded: tf.Tensor, batch_size: int, one_core: bool) -> tf.data.Dataset:
    """Pipeline `name` (a key of PIPELINES), repeating forever, in batches of `batch_size`."""
    if name.startswith("towerflow_"):
        dataset = _towerflow(pattern, name.removeprefix("towerflow_"), batch_size)
    else:
        per_image = {"decode": _decode, "whole_then_crop": _whole_then_crop, "crop_decode": _crop_decode}[name]
        dataset = tf.data.Dataset.from_tensor_slices(encoded).repeat().enumerate()
        dataset = dataset.map(per_image, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        dataset = dataset.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return with_run_options(dataset).with_options(thread_options(one_core))


def _towerflow(pattern: str, augment: str, batch_size: int) -> tf.data.Dataset:
    info = data.inspect_records(pattern, data.ImageSchema(image_size=IMAGE_SIZE))
    return data.make_dataset(
        info, batch_size=batch_size, training=True, seed=_SEED, preprocess=data.Preprocess(augment)
    ).map(lambda images, labels: images)


def _decode(index, encoded):
    del index
    return tf.io.decode_jpeg(encoded, channels=3)


def _key(index):
    return augment_lib.example_key(augment_lib.stream_key(_SEED, 0), tf.stack([tf.constant(0, tf.int64), index]))


def _resized_flipped(cropped, key):
    resized = tf.image.resize(cropped, IMAGE_SIZE, method="bilinear")
    return augment_lib.flip(tf.ensure_shape(resized, [*IMAGE_SIZE, 3]), key)


def _whole_then_crop(index, encoded):
    key = _key(index)
    image = tf.io.decode_jpeg(encoded, channels=3)
    cropped = augment_lib.crop(image, augment_lib.random_window(key)(tf.shape(image)))
    return _resized_flipped(cropped, key)


def _crop_decode(index, encoded):
    key = _key(index)
    return _resized_flipped(augment_lib.decode_crop(encoded, augment_lib.random_window(key), 3), key)
