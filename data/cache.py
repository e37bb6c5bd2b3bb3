"""A training stream's records decoded once into memory (`--cache=memory`), augmented after the cache.

`decode_records` reads the stream's files once, as the reader does (same chunks, same corrupt-record
accounting), and keeps every record's label and decoded uint8 image, before any resize, crop or random
step. The stream then computes the reader's position-keyed epoch order (file shuffle, interleave, chunk
shuffles, shuffle buffer) over record ids, one epoch at a time (`data.order`), and gathers each batch's images
by id: the same permutations, so a cached and an uncached run see the same examples in the same order and
compute the same batches, bit for bit, and a resume is the same (epoch, record) position. No file is read
after the first pass, and nothing is parsed or decoded again.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from data import schema as schema_lib
from data.options import with_run_options
from data.parse import raw_image_parser
from data.schema import DataError, RecordInfo

# --cache=auto caches when the estimated memory of the decoded training images is below this.
AUTO_CACHE_BYTES = 2 << 30
_BUILD_BATCH = 512


@dataclasses.dataclass(frozen=True)
class DecodedRecords:
    """One stream's files, decoded. Records are numbered in file order; file f holds ids
    [starts[f], starts[f] + counts[f]).

    Attributes:
        files: The stream's files, as `data.order.training_share` gives them.
        starts, counts: Per file, the first record id and the number of records.
        labels: int32 [N], after label_offset, checked against num_classes.
        images: uint8 [N, H, W, C] when every image has one shape, else None.
        flat, offsets, shapes: Otherwise, the images' bytes end to end, where each starts (int64 [N + 1]) and
            its shape (int32 [N, 3]).
    """

    files: tuple[str, ...]
    starts: tuple[int, ...]
    counts: tuple[int, ...]
    labels: tf.Tensor
    images: tf.Tensor | None
    flat: tf.Tensor | None = None
    offsets: tf.Tensor | None = None
    shapes: tf.Tensor | None = None

    def image(self, record_id: tf.Tensor) -> tf.Tensor:
        """One record's decoded image, uint8 [h, w, C]."""
        if self.images is not None:
            return tf.gather(self.images, record_id)
        start, end = self.offsets[record_id], self.offsets[record_id + 1]
        return tf.reshape(self.flat[start:end], self.shapes[record_id])


def decode_records(info: RecordInfo, files, num_classes: int | None, bad_records) -> DecodedRecords:
    """Reads and decodes every record of `files` (a share of `info.files`), eagerly, on the current device.

    Raises:
        DataError: A record that does not parse or decode, a label outside [0, num_classes), images of
            several sizes without image_size, or more corrupt records than the budget.
    """
    bad_records.register(info, num_classes, True)
    read = bad_records.chunk_reader(info)
    parse = raw_image_parser(info, num_classes)
    flats, shapes, labels, counts = [], [], [], []
    try:
        for path in files:
            records = read(tf.constant(path)).unbatch().batch(_BUILD_BATCH)
            count = 0
            for flat, shape, label in _elements(
                records.map(
                    tf.autograph.experimental.do_not_convert(parse),
                    num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=True,
                )
            ):
                flats.append(flat.numpy())
                shapes.append(shape.numpy())
                labels.append(label.numpy())
                count += len(label)
            counts.append(count)
    except tf.errors.OpError as e:
        explained = bad_records.explain(e, True)
        if explained is None:
            raise
        raise explained from e
    return _stacked(info, tuple(files), counts, flats, shapes, labels)


def _elements(dataset: tf.data.Dataset):
    """The elements of `dataset`, ended by an empty optional rather than by OutOfRangeError: on another task's
    device that error also poisoned the eager executor, which raised it again when collected ("Exception
    ignored in Executor.__del__ ... End of sequence", twice at every multi-task start with a cache)."""
    iterator = iter(with_run_options(dataset))
    while (element := iterator.get_next_as_optional()).has_value():
        yield element.get_value()


def _stacked(info: RecordInfo, files, counts, flats, shapes, labels) -> DecodedRecords:
    starts = tuple(int(v) for v in np.cumsum([0, *counts[:-1]]))
    shapes = np.concatenate(shapes) if shapes else np.zeros([0, 3], np.int32)
    values = np.concatenate(flats) if flats else np.zeros([0], np.uint8)
    common = (files, starts, tuple(counts), tf.constant(np.concatenate(labels) if labels else np.zeros([0], np.int32)))
    if len(np.unique(shapes, axis=0)) <= 1:
        shape = tuple(int(v) for v in shapes[0]) if len(shapes) else info.example_shape
        return DecodedRecords(*common, images=tf.constant(values.reshape(-1, *shape)))
    if info.schema.image_size is None:
        height, width, channels = info.example_shape
        raise DataError(
            f"an image is not {height}x{width}x{channels} like the first record; pass --image_size=H,W "
            "(ImageSchema.image_size) to resize every image to one size"
        )
    offsets = np.concatenate([[0], np.cumsum(np.prod(shapes, axis=1))])
    return DecodedRecords(
        *common, images=None, flat=tf.constant(values), offsets=tf.constant(offsets), shapes=tf.constant(shapes)
    )


def estimated_bytes(info: RecordInfo) -> int:
    """The memory a cache of `info`'s records would take, estimated without reading them all: records = file
    bytes / the first record's framed size, times its decoded pixels (uint8, at its stored size)."""
    files = list(info.files)
    total = sum(tf.io.gfile.stat(path).length for path in files)
    first = next(iter(with_run_options(tf.data.TFRecordDataset(files[0]).take(1)))).numpy()
    height, width, channels = _stored_shape(tf.train.Example.FromString(first).features.feature)
    return int(total / (len(first) + schema_lib.FRAME_BYTES) * height * width * channels)


def _stored_shape(feature) -> tuple[int, int, int]:
    keys = (schema_lib.IMAGE_HEIGHT_KEY, schema_lib.IMAGE_WIDTH_KEY, schema_lib.IMAGE_CHANNELS_KEY)
    if all(key in feature and feature[key].int64_list.value for key in keys):
        return tuple(int(feature[key].int64_list.value[0]) for key in keys)
    image = tf.io.decode_image(feature[schema_lib.IMAGE_ENCODED_KEY].bytes_list.value[0], expand_animations=False)
    return tuple(int(v) for v in image.shape)
