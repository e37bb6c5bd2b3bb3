"""Reading TFRecords: find the files, learn the schema from the first record, build the tf.data pipeline."""

from __future__ import annotations

import tensorflow as tf
from google.protobuf import message as protobuf_message

from data import augment as augment_lib
from data import order as order_lib
from data import schema as schema_lib
from data.cache import DecodedRecords, decode_records
from data.integrity import BadRecords
from data.parse import batch_parser, cached_parser
from data.schema import DataError, DenseSchema, ImageSchema, Preprocess, RecordInfo


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
    features = _read_first_example(files[0]).features.feature
    if schema is None:
        schema = _detect_schema(features, files[0])
    _check_keys(schema, features, files[0])
    if isinstance(schema, ImageSchema):
        shape = _image_shape(schema, features, files[0])
    else:
        shape = _dense_shape(schema, features, files[0])
    return RecordInfo(schema=schema, example_shape=shape, files=files)


def _read_first_example(path: str) -> tf.train.Example:
    try:
        records = list(tf.data.TFRecordDataset(path).take(1))
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
    raise DataError(
        f"cannot tell the schema of {path}: {_describe_keys(features)}. ImageSchema needs "
        f"'{schema_lib.IMAGE_ENCODED_KEY}' and '{schema_lib.IMAGE_LABEL_KEY}'; DenseSchema needs a float_list "
        f"'{dense.feature_key}' and an int64 '{dense.label_key}' (or pass DenseSchema(feature_key=..., "
        "label_key=...) for other keys)"
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


def make_dataset(
    info: RecordInfo,
    *,
    batch_size: int,
    training: bool,
    seed: int = 0,
    worker_index: int = 0,
    num_workers: int = 1,
    shuffle_buffer: int = 10_000,
    drop_remainder: bool | None = None,
    num_classes: int | None = None,
    bad_records: BadRecords | None = None,
    resume_from: tuple[int, int] | None = None,
    preprocess: Preprocess | None = None,
    cache: DecodedRecords | None = None,
) -> tf.data.Dataset:
    """Builds the input pipeline: (features float32 [B, *example_shape], labels int32 [B]) batches.

    Training: this worker's files (files[worker_index::num_workers]; with fewer files than workers, a fixed
    share of one file's records, see `_training_share`) in a seeded random order, read in parallel but
    deterministically, records shuffled with `seed`, repeated forever, full batches only.
    Eval: this worker's files in order, each record once, no shuffle, last batch may be short. With fewer
    files than workers, every eval worker reads all files and keeps every num_workers-th record.
    The shuffle buffer holds serialized records, so its memory and checkpoint size are those of the files.
    The pipeline is deterministic. A training pipeline resumes exactly from the position its batches carry
    (`resume_from`); `tf.train.Checkpoint(iterator=iter(ds))` also works, shuffle buffer included.

    Bad records fail the pipeline with a TensorFlow error that names no file: a corrupt record (bad CRC,
    truncated file) beyond `bad_records.max_bad_records` in training (they are skipped up to it) or any in
    eval, a record that does not parse or decode, a label outside [0, num_classes).
    `bad_records.explain(error, training)` turns the error into a DataError naming the file and the record.

    Args:
        info: From `inspect_records`.
        batch_size: Examples per batch (the global batch for this worker).
        training: Selects the training or the eval pipeline (see above).
        seed: Seed of the file-order and record shuffles.
        worker_index: This worker's index in [0, num_workers).
        num_workers: Number of workers the files are split between.
        shuffle_buffer: Records in the shuffle buffer (training only), reshuffled every epoch.
        drop_remainder: Whether to drop a short last batch; None means True for training, False for eval.
        num_classes: Labels (after the schema's label_offset) must lie in [0, num_classes); None: unchecked.
        bad_records: The run's budget and count of corrupt records, shared by its pipelines; None: a budget
            of 0, and no way to explain a failure.
        resume_from: Training only: an (epoch, record) position, as the third element of a batch of this
            pipeline gave it. The dataset then starts there and yields (features, labels, position), the
            position after the batch's last record: all a checkpoint needs to resume exactly (see
            `_training_records`), a few bytes instead of the shuffle buffer.
        preprocess: Image augmentation (training only) and normalization (`data.augment`); None: neither.
            The random steps of an example are keyed on (seed, worker_index, epoch, record index): its
            position, never the towers, the parallelism or a resume.
        cache: Training only: this worker's records decoded once (`decode_share`, same worker_index and
            num_workers): no file is read, parsed or decoded again, and the batches are those of an uncached
            pipeline, bit for bit. Each epoch's order is computed in one step (`data.order`) and each batch
            gathered by id, with no tf.data element per record. Keep it across rebuilds of the stream.

    Returns:
        The tf.data.Dataset.

    Raises:
        DataError: For a bad argument.
    """
    _check_dataset_args(batch_size, worker_index, num_workers, shuffle_buffer)
    bad_records = bad_records or BadRecords()
    bad_records.register(info, num_classes, training)
    drop = training if drop_remainder is None else drop_remainder
    if training:
        share = _training_share(info.files, worker_index, num_workers)
        key = augment_lib.stream_key(seed, worker_index)
        start = resume_from or (0, 0)
        if cache is None:
            parse = batch_parser(info, num_classes, preprocess=preprocess, training=True, stream_key=key)
            records = _training_records(share, seed, shuffle_buffer, bad_records.chunk_reader(info), start)
            batches = _position_batches(records, batch_size, drop)
        else:
            parse = cached_parser(_checked(cache, share, worker_index), info, preprocess or Preprocess(), key)
            stream = _stream_order(cache, share, seed, shuffle_buffer)
            batches = order_lib.id_batches(stream, start, batch_size, drop)
        batch_parse = _with_position(parse, keep=resume_from is not None)
    else:
        # Parse whole batches: one vectorized parse op per batch instead of one per example. Per-element
        # tf.data overhead dominates small images: this reads the 8x8 digits ~1.5x faster on 2 cores.
        batches = _eval_records(info.files, worker_index, num_workers).batch(batch_size, drop_remainder=drop)
        batch_parse = batch_parser(info, num_classes, preprocess=preprocess)
    dataset = batches.map(batch_parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    options.deterministic = True
    # Reading training files writes bad_records' table, which the run checkpoints itself; without IGNORE,
    # saving the iterator refuses a pipeline with such stateful ops.
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    # No autotuning model: with it, deleting an iterator (a stream rebuilt after a restore, an eval pass, a
    # finished run's streams) waited for the model's thread, 30-80 s at a time on a busy 2-core machine
    # (docs/facts.md). Without it each AUTOTUNE map runs one call per core and prefetch grows its own
    # buffer; throughput measured the same (benchmarks.inputs, tfrecord_vs_memory).
    options.autotune.enabled = False
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)


def decode_share(
    info: RecordInfo,
    *,
    worker_index: int = 0,
    num_workers: int = 1,
    num_classes: int | None = None,
    bad_records: BadRecords | None = None,
) -> DecodedRecords:
    """Reads and decodes worker `worker_index`'s training files once, for `make_dataset(cache=...)`.

    Raises:
        DataError: A bad record (see `data.cache.decode_records`), or dense records (nothing to decode).
    """
    if not isinstance(info.schema, ImageSchema):
        raise DataError("only image records are cached: dense records are not decoded")
    files, _, _ = _training_share(info.files, worker_index, num_workers)
    return decode_records(info, files, num_classes, bad_records or BadRecords())


def _checked(cache: DecodedRecords, share, worker_index: int) -> DecodedRecords:
    if cache.files != tuple(share[0]):
        raise DataError(f"the cache holds {list(cache.files)}, but worker {worker_index} reads {list(share[0])}")
    return cache


def _stream_order(cache: DecodedRecords, share, seed: int, shuffle_buffer: int) -> order_lib.StreamOrder:
    """The order `_training_records` gives this share's records, as tensor ops over the cache's record ids."""
    _, share_index, shares = share
    kept = len(range(share_index, sum(cache.counts), shares))
    buffer = order_lib.buffer_order(kept, shuffle_buffer, seed)
    return order_lib.StreamOrder(cache.starts, cache.counts, seed, share_index, shares, buffer)


def _with_position(parse, keep: bool):
    def parse_with_position(positions, records):
        features, labels = parse(records, positions)
        return (features, labels, positions[-1]) if keep else (features, labels)

    return parse_with_position


def _check_dataset_args(batch_size: int, worker_index: int, num_workers: int, shuffle_buffer: int) -> None:
    if batch_size < 1:
        raise DataError(f"batch_size ({batch_size}) must be >= 1")
    if num_workers < 1:
        raise DataError(f"num_workers ({num_workers}) must be >= 1")
    if not 0 <= worker_index < num_workers:
        raise DataError(f"worker_index ({worker_index}) must be in [0, num_workers={num_workers})")
    if shuffle_buffer < 1:
        raise DataError(f"shuffle_buffer ({shuffle_buffer}) must be >= 1")


def _training_records(share, seed: int, shuffle_buffer: int, read_chunks, start: tuple[int, int]) -> tf.data.Dataset:
    """(e, (i + 1, record)) forever, epoch after epoch, from `start` = (epoch, record index) on.

    Epoch e is a pipeline of its own, seeded by (seed, e): its files in a random order, read in parallel but
    deterministically, its records shuffled. So record i of epoch e is a function of (seed, e, i) alone, and
    a position is resumed by rebuilding epoch e and skipping i records (read, not decoded: at most one
    epoch's bytes of this worker's share). The record's position is (e, i + 1): where the next record is.
    """
    own_files, share_index, shares = share
    first_epoch, first_record = start

    def epoch_records(epoch):
        # Stateless ops keyed on (seed, epoch): tf.data's own seeded shuffle cannot take a per-epoch seed
        # tensor (with a global seed of 0 it tests the tensor as a Python bool). So the file order and the
        # order inside each chunk of records change with the epoch; the buffer shuffle's seed is fixed.
        # data.order computes this same order over a decoded cache's record ids: keep the two in step.
        epoch = tf.cast(epoch, tf.int64)
        files = order_lib.shuffled_files(own_files, seed, epoch)
        # Each file yields chunks of its records (data.integrity counts their bytes to find corrupt ones), and
        # whole chunks cross the interleave: its per-element cost is then paid per chunk, not per record.
        chunks = tf.data.Dataset.from_tensor_slices(files).interleave(
            read_chunks,
            cycle_length=order_lib.cycle_length(len(own_files)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        shuffle = tf.random.experimental.stateless_shuffle
        chunks = chunks.enumerate().map(lambda c, chunk: shuffle(chunk, order_lib.part_key(seed, epoch, c + 1)))
        records = chunks.unbatch()
        if shares > 1:
            records = records.shard(shares, share_index)
        # Shuffle the serialized records, not the decoded float tensors: the buffer (in memory) is then as
        # small as the files, e.g. ~100 KB per ImageNet JPEG instead of 600 KB.
        records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=False)
        # The position (e, i + 1) is stacked per batch (`_position_batches`), not per record: a map per record
        # cost 3.7 ms of CPU per batch of 128 digits, where the whole order costs 0.7 ms without it.
        return tf.data.Dataset.zip(tf.data.Dataset.from_tensors(epoch).repeat(), records.enumerate(start=1))

    resumed = epoch_records(tf.constant(first_epoch, tf.int64)).skip(first_record)
    return resumed.concatenate(tf.data.Dataset.counter(first_epoch + 1).flat_map(epoch_records))


def _position_batches(records: tf.data.Dataset, batch_size: int, drop: bool) -> tf.data.Dataset:
    """(positions int64 [B, 2], records [B]) batches of `_training_records`."""
    batches = records.batch(batch_size, drop_remainder=drop)
    return batches.map(lambda epochs, pairs: (tf.stack([epochs, pairs[0]], axis=1), pairs[1]))


def _training_share(files: tuple[str, ...], worker_index: int, num_workers: int) -> tuple[list[str], int, int]:
    """Worker w's files, and which share of their records it keeps: (files, share index, number of shares).

    With at least as many files as workers, worker w reads files[w::W], every record. With fewer (F < W),
    worker w reads file w % F alone and keeps every c-th record from the (w // F)-th, c being the number of
    workers on that file: every record still goes to exactly one worker, each worker's records are fixed by
    (w, W), and only the bytes of a shared file are read more than once.
    """
    if len(files) >= num_workers:
        return list(files[worker_index::num_workers]), 0, 1
    file_index = worker_index % len(files)
    sharing = len(range(file_index, num_workers, len(files)))
    return [files[file_index]], worker_index // len(files), sharing


def _eval_records(files: tuple[str, ...], worker_index: int, num_workers: int) -> tf.data.Dataset:
    if len(files) >= num_workers:
        return tf.data.TFRecordDataset(list(files[worker_index::num_workers]))
    # Too few files to give each worker its own: every worker reads all files and keeps every
    # num_workers-th record. Slower, but eval must see each example exactly once whatever the sharding.
    return tf.data.TFRecordDataset(list(files)).shard(num_workers, worker_index)
