"""The tf.data pipelines: (features float32 [B, *example_shape], labels int32 [B]) batches of a `RecordInfo`.

Two pipelines, one function each: `training_dataset` (this stream's share of the files, in its seeded
order, repeated forever, with positions to resume from; read from the files or from a decoded cache) and
`eval_dataset` (this worker's records, each once, in order). Both take a `Stream`: which share of the records,
in what order, checked how, and how each example is made. `make_dataset` is both by keyword.

Both pipelines are deterministic. Bad records fail the pipeline with a TensorFlow error that names no file: a
corrupt record (bad CRC, truncated file) beyond `bad_records.max_bad_records` in training (they are skipped up
to it) or any in eval, a record that does not parse or decode, a label outside [0, num_classes).
`bad_records.explain(error, training)` turns the error into a DataError naming the file and the record.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from data import augment as augment_lib
from data import order as order_lib
from data.cache import DecodedRecords, decode_records
from data.integrity import BadRecords
from data.options import with_run_options
from data.parse import batch_parser, cached_parser
from data.schema import DataError, ImageSchema, Preprocess, RecordInfo


@dataclasses.dataclass(frozen=True)
class Stream:
    """One pipeline's reading: which records, in what order, checked how, made into what.

    Attributes:
        batch_size: Examples per batch (the global batch for this worker).
        worker_index: This worker's index in [0, num_workers).
        num_workers: Number of workers the files are split between (`data.order.training_share`,
            `data.order.eval_records`).
        seed: Training only: seed of the file-order and record shuffles.
        shuffle_buffer: Training only: records in the shuffle buffer, reshuffled every epoch. It holds
            serialized records, so its memory is that of the files.
        num_classes: Labels (after the schema's label_offset) must lie in [0, num_classes); None: unchecked.
        bad_records: The run's budget and count of corrupt records, shared by its pipelines; None: a budget
            of 0, and no way to explain a failure.
        preprocess: Image augmentation (training only) and normalization (`data.augment`); None: neither.
            The random steps of an example are keyed on (seed, worker_index, epoch, record index): its
            position, never the towers, the parallelism or a resume.
        drop_remainder: Whether to drop a short last batch; None means True for training, False for eval.
    """

    batch_size: int
    worker_index: int = 0
    num_workers: int = 1
    seed: int = 0
    shuffle_buffer: int = 10_000
    num_classes: int | None = None
    bad_records: BadRecords | None = None
    preprocess: Preprocess | None = None
    drop_remainder: bool | None = None

    def __post_init__(self):
        if self.batch_size < 1:
            raise DataError(f"batch_size ({self.batch_size}) must be >= 1")
        if self.num_workers < 1:
            raise DataError(f"num_workers ({self.num_workers}) must be >= 1")
        if not 0 <= self.worker_index < self.num_workers:
            raise DataError(f"worker_index ({self.worker_index}) must be in [0, num_workers={self.num_workers})")
        if self.shuffle_buffer < 1:
            raise DataError(f"shuffle_buffer ({self.shuffle_buffer}) must be >= 1")


def make_dataset(
    info: RecordInfo,
    *,
    training: bool,
    resume_from: tuple[int, int] | None = None,
    cache: DecodedRecords | None = None,
    **stream,
) -> tf.data.Dataset:
    """`training_dataset(info, Stream(**stream), ...)` or `eval_dataset(info, Stream(**stream))`.

    Raises:
        DataError: For a bad argument.
    """
    if training:
        return training_dataset(info, Stream(**stream), resume_from=resume_from, cache=cache)
    if resume_from is not None or cache is not None:
        raise DataError("resume_from and cache are for training pipelines only")
    return eval_dataset(info, Stream(**stream))


def training_dataset(
    info: RecordInfo,
    stream: Stream,
    *,
    resume_from: tuple[int, int] | None = None,
    cache: DecodedRecords | None = None,
) -> tf.data.Dataset:
    """This worker's files (`data.order.training_share`) in a seeded random order, read in parallel but
    deterministically, records shuffled with `stream.seed`, repeated forever, full batches only.

    Args:
        info: From `inspect_records`.
        stream: What to read and how.
        resume_from: An (epoch, record) position, as the third element of a batch of this pipeline gave it.
            The dataset then starts there and yields (features, labels, position), the position after the
            batch's last record: all a checkpoint needs to resume exactly (`data.order.training_records`), a
            few bytes instead of the shuffle buffer. Without it, `tf.train.Checkpoint(iterator=iter(ds))`
            also works, shuffle buffer included.
        cache: This worker's records decoded once (`decode_share`, same worker_index and num_workers): no
            file is read, parsed or decoded again, and the batches are those of an uncached pipeline, bit for
            bit. Each epoch's order is computed in one step (`data.order.StreamOrder`) and each batch
            gathered by id, with no tf.data element per record. Keep it across rebuilds of the stream.
    """
    bad_records = registered(info, stream, training=True)
    share = order_lib.training_share(info.files, stream.worker_index, stream.num_workers)
    where = _Start(share, augment_lib.stream_key(stream.seed, stream.worker_index), resume_from or (0, 0))
    if cache is None:
        parse, batches = _from_files(info, stream, where, bad_records)
    else:
        parse, batches = _from_cache(info, stream, where, cache)
    return finished(
        batches.map(
            tf.autograph.experimental.do_not_convert(_with_position(parse, keep=resume_from is not None)), **IN_ORDER
        )
    )


@dataclasses.dataclass(frozen=True)
class _Start:
    """Where a training stream starts: its share of the files, its augmentation key, its (epoch, record)."""

    share: order_lib.Share
    key: tf.Tensor
    position: tuple[int, int]


def _from_files(info: RecordInfo, stream: Stream, start: _Start, bad_records: BadRecords):
    """(parse, batches of (positions, serialized records)): the training stream read from its files."""
    parse = batch_parser(info, stream.num_classes, preprocess=stream.preprocess, training=True, stream_key=start.key)
    read = bad_records.chunk_reader(info)
    records = order_lib.training_records(start.share, stream.seed, stream.shuffle_buffer, read, start.position)
    return parse, order_lib.position_batches(records, stream.batch_size, drop_last(stream, True))


def _from_cache(info: RecordInfo, stream: Stream, start: _Start, cache: DecodedRecords):
    """(parse, batches of (positions, record ids)): the same stream over its decoded records, bit for bit."""
    _check_cache(cache, start.share, stream.worker_index)
    parse = cached_parser(cache, info, stream.preprocess or Preprocess(), start.key)
    ids = order_lib.stream_order(cache.starts, cache.counts, start.share, stream.seed, stream.shuffle_buffer)
    return parse, order_lib.id_batches(ids, start.position, stream.batch_size, drop_last(stream, True))


def eval_dataset(info: RecordInfo, stream: Stream) -> tf.data.Dataset:
    """This worker's files in order, each record once, no shuffle, the last batch maybe short. With fewer
    files than workers, every eval worker reads all files and keeps every num_workers-th record."""
    registered(info, stream, training=False)
    records = order_lib.eval_records(info.files, stream.worker_index, stream.num_workers)
    # Parse whole batches: one vectorized parse op per batch instead of one per example. Per-element
    # tf.data overhead dominates small images: this reads the 8x8 digits ~1.5x faster on 2 cores.
    batches = records.batch(stream.batch_size, drop_remainder=drop_last(stream, False))
    return finished(
        batches.map(
            tf.autograph.experimental.do_not_convert(
                batch_parser(info, stream.num_classes, preprocess=stream.preprocess)
            ),
            **IN_ORDER,
        )
    )


def decode_share(
    info: RecordInfo,
    *,
    worker_index: int = 0,
    num_workers: int = 1,
    num_classes: int | None = None,
    bad_records: BadRecords | None = None,
) -> DecodedRecords:
    """Reads and decodes worker `worker_index`'s training files once, for `training_dataset(cache=...)`.

    Raises:
        DataError: A bad record (see `data.cache.decode_records`), or dense records (nothing to decode).
    """
    if not isinstance(info.schema, ImageSchema):
        raise DataError("only image records are cached: dense records are not decoded")
    files, _, _ = order_lib.training_share(info.files, worker_index, num_workers)
    return decode_records(info, files, num_classes, bad_records or BadRecords())


IN_ORDER = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": True}


def registered(info: RecordInfo, stream: Stream, training: bool) -> BadRecords:
    """The stream's bad-record budget (a budget of 0 when it has none), told what this pipeline reads."""
    bad_records = stream.bad_records or BadRecords()
    bad_records.register(info, stream.num_classes, training)
    return bad_records


def drop_last(stream: Stream, training: bool) -> bool:
    """Whether to drop a short last batch: as the stream says, else in training only."""
    return training if stream.drop_remainder is None else stream.drop_remainder


def _check_cache(cache: DecodedRecords, share: order_lib.Share, worker_index: int) -> None:
    if cache.files != tuple(share.files):
        raise DataError(f"the cache holds {list(cache.files)}, but worker {worker_index} reads {list(share.files)}")


def _with_position(parse, keep: bool):
    def parse_with_position(positions, records):
        features, labels = parse(records, positions)
        return (features, labels, positions[-1]) if keep else (features, labels)

    return parse_with_position


def finished(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` prefetched, with the options every pipeline runs under (`data.options`)."""
    return with_run_options(dataset.prefetch(tf.data.AUTOTUNE))
