"""Bad records in a run's input pipelines: skip a budget of corrupt ones, name the one that fails the run.

The pipeline runs inside the training step's tf.function, so a bad record reaches Python as a bare
`tf.errors.DataLossError` or `InvalidArgumentError` that names no file. `BadRecords` knows the files of the
run's pipelines and turns such an error into a `DataError` naming the file and the record:

- Damaged frames (bad CRC, truncated file) in training data: each file is read by its own
  `TFRecordDataset` with `ignore_errors()`, so a damaged frame ends that file's records instead of the
  pipeline (the reader cannot resynchronise: the record and the rest of its file are skipped). A scan over
  chunks of the file's records counts their bytes; a file that ends before its size had a corrupt record at
  that byte offset. It goes into `table`, is printed once to stderr, and past `max_bad_records` distinct
  ones the pipeline fails; `explain` names them from the table. The reader is the same whatever the
  budget, so a run that failed can resume from its checkpoint with a budget. It costs one function call
  per chunk, not per record (~15 us each here), and whole chunks cross the interleave: on the digits the
  pipeline reads 1.14x as many examples/sec as with a plain TFRecordDataset per file.
- Anything else (a record whose CRC is right but does not parse or decode, a label outside
  [0, num_classes), a task's record lacking a key or holding a value outside its feature's bounds, any bad
  record of eval data, which is not checkpointed and uses a plain reader): the
  pipeline fails, and `explain` reads the files again (data.check: batched and parallel, up to the first bad
  batch) to name the record. Only a failing run pays for that read, and only for errors raised by reading
  a pipeline (an out-of-memory in the model is not searched for). Such records are never skipped: one
  whose CRC is right was written that way, and only rewriting it helps.
"""

from __future__ import annotations

import dataclasses
import sys

import tensorflow as tf

from data import check, features
from data.schema import FRAME_BYTES, DataError, DenseSchema, FeatureSchema, RecordInfo

# Records per chunk of the byte count: one function call (~70 us here) per chunk instead of per record.
CHUNK = 64
# Key of a corrupt record = file id * _FILE_STRIDE + record index, the file id a fingerprint of its path:
# keys restored from a checkpoint then name the same files in a new process, whatever the order of the glob.
_FILE_STRIDE = 1 << 32
_FILE_IDS = (1 << 31) - 1
_HOST = "/device:CPU:0"  # tf.data runs on the host; the table lives there too
_MAX_LISTED = 3  # corrupt records named in one message


@dataclasses.dataclass(frozen=True)
class CorruptRecord:
    """A damaged frame met in training data: the record and the rest of its file were skipped."""

    path: str
    index: int
    offset: int
    skipped_bytes: int


@dataclasses.dataclass(frozen=True)
class _Pipeline:
    info: RecordInfo
    num_classes: int | None
    training: bool


class BadRecords:
    """The files of a run's pipelines, the budget of corrupt training records and the count skipped.

    Args:
        max_bad_records: Distinct corrupt training records to skip before failing. Eval data gets none.

    Raises:
        DataError: If max_bad_records is negative.

    `count` is the number of distinct corrupt records met so far (one met again in a later epoch counts
    once). `table` holds them; it belongs in the run's checkpoint, so the count survives a resume.
    """

    def __init__(self, max_bad_records: int = 0):
        if max_bad_records < 0:
            raise DataError(f"max_bad_records ({max_bad_records}) must be >= 0")
        self.max_bad_records = max_bad_records
        with tf.init_scope(), tf.device(_HOST):
            # key: see _FILE_STRIDE; value: the record's byte offset.
            self.table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1)
        self._pipelines: list[_Pipeline] = []
        self._files: dict[int, tuple[str, int]] = {}  # file id -> (path, size) of every training file read

    def register(self, info: RecordInfo, num_classes: int | None, training: bool) -> None:
        """Records a pipeline's files, so that `explain` can search them."""
        pipeline = _Pipeline(info, num_classes, training)
        if pipeline not in self._pipelines:
            self._pipelines.append(pipeline)

    @property
    def count(self) -> int:
        """Distinct corrupt training records met so far: skipped, or (past the budget) failing the run."""
        return int(self.table.size())

    def corrupt_records(self) -> list[CorruptRecord]:
        """The corrupt training records met so far, by file and record index."""
        keys, offsets = (t.numpy() for t in self.table.export())
        found = []
        for key, offset in zip(keys.tolist(), offsets.tolist(), strict=True):
            # A file restored from a checkpoint may have left the glob since: it is counted, but nameless.
            path, size = self._files.get(key // _FILE_STRIDE, ("(a file no longer in the data)", offset))
            found.append(CorruptRecord(path, key % _FILE_STRIDE, offset, size - offset))
        return sorted(found, key=lambda r: (r.path, r.index))

    def chunk_reader(self, info: RecordInfo):
        """Returns `read(path) -> dataset of string vectors`: the file's records in chunks, skipping and
        counting corrupt records (unbatch the chunks to get records)."""
        sizes = [tf.io.gfile.stat(path).length for path in info.files]
        ids = tf.strings.to_hash_bucket_fast(list(info.files), _FILE_IDS).numpy().tolist()
        self._files.update(zip(ids, zip(info.files, sizes, strict=True), strict=True))
        size_of = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(list(info.files)), tf.constant(sizes, tf.int64)), -1
        )

        def read(path: tf.Tensor) -> tf.data.Dataset:
            return self._read_file(tf.strings.to_hash_bucket_fast(path, _FILE_IDS), path, size_of.lookup(path))

        return read

    def _read_file(self, file_id: tf.Tensor, path: tf.Tensor, size: tf.Tensor) -> tf.data.Dataset:
        # ignore_errors: a damaged frame ends this file's records instead of the whole pipeline.
        chunks = tf.data.TFRecordDataset(path).ignore_errors().batch(CHUNK)
        # An empty chunk marks the end (`batch` never makes one): there the byte count must equal the size.
        chunks = chunks.concatenate(tf.data.Dataset.from_tensors(tf.zeros([0], tf.string)))

        def account(state, chunk):
            offset, index = state
            count = tf.size(chunk, out_type=tf.int64)
            ended_early = tf.logical_and(tf.equal(count, 0), offset < size)
            report = tf.cond(ended_early, lambda: self._report(file_id, path, index, offset), tf.no_op)
            payload = tf.reduce_sum(tf.cast(tf.strings.length(chunk, unit="BYTE"), tf.int64))
            with tf.control_dependencies([report]):
                return (offset + payload + FRAME_BYTES * count, index + count), tf.identity(chunk)

        start = (tf.constant(0, tf.int64), tf.constant(0, tf.int64))
        return chunks.scan(start, account)

    def _report(self, file_id, path, index, offset) -> tf.Operation:
        """Puts a damaged frame in the table, warns the first time, fails past the budget."""
        key = file_id * _FILE_STRIDE + index
        is_new = tf.less(self.table.lookup(key), 0)
        with tf.control_dependencies([self.table.insert(key, offset)]):
            count = self.table.size()
        allowed = count <= self.max_bad_records
        where = ("warning: skipping corrupt record", index, "of", path, "at byte offset", offset)
        budget = ("and the rest of that file, in every epoch;", count, f"of --max_bad_records={self.max_bad_records}")
        warn = tf.cond(
            tf.logical_and(is_new, allowed), lambda: tf.print(*where, *budget, output_stream=sys.stderr), tf.no_op
        )
        with tf.control_dependencies([warn]):
            return tf.debugging.Assert(allowed, ["more corrupt records than --max_bad_records"])

    def explain(self, error: BaseException, training: bool, log=None) -> DataError | None:
        """A DataError naming the record behind an input pipeline's failure, or None if no record is to blame.

        Args:
            error: What iterating the pipeline raised: a `tf.errors.OpError`, or an exception whose
                `__cause__` chain holds one (async towers wrap theirs).
            training: Whether the training or the eval pipelines failed: their files are searched.
            log: Called with one line before a search that reads the data again.
        """
        op_error = _op_error(error)
        if op_error is None or "IteratorGetNext" not in op_error.message:
            return None  # not raised by reading an input pipeline (the op's name is in every such message)
        corrupt = self.corrupt_records() if training else []
        if len(corrupt) > self.max_bad_records:
            return DataError(_over_budget(corrupt, self.max_bad_records))
        what = "--train_data" if training else "--eval_data"
        if log is not None:
            log(f"the {what} input pipeline failed ({check.first_line(op_error.message)}); reading it again")
        for p in (p for p in self._pipelines if p.training == training):
            # The training pipeline skipped every corrupt record it met (the table holds them): step over them.
            found = _find_bad_record(p, skip_corrupt=training)
            if found is not None:
                return DataError(f"{what} {found}")
        return None

    def explain_divergence(self, diverged: BaseException, log=None) -> DataError | None:
        """A DataError naming a training record whose features are NaN or inf, after a run on dense records
        diverged, or None (no such record: the divergence is the training's own).

        The training pipeline does not look for them (a pass over every batch's features, on the host): a
        divergence reads the dense training files once, batched and in parallel, as `explain` does.
        """
        dense = [p for p in self._pipelines if p.training and isinstance(p.info.schema, DenseSchema)]
        if dense and log is not None:
            log(f"training diverged ({diverged}); reading --train_data for NaN or inf features")
        for p in dense:
            found = check.find_bad_record(p.info, p.num_classes, skip_corrupt=True)
            if found is not None:
                return DataError(f"--train_data {found} (training diverged: {diverged})")
        return None


def _find_bad_record(pipeline: _Pipeline, skip_corrupt: bool) -> str | None:
    """The first record of a pipeline's files that stops it, named; a task's records name the task and the
    feature too."""
    if isinstance(pipeline.info.schema, FeatureSchema):
        return features.find_bad_feature_record(pipeline.info, skip_corrupt)
    found = check.find_bad_record(pipeline.info, pipeline.num_classes, skip_corrupt=skip_corrupt)
    return None if found is None else str(found)


def _op_error(error: BaseException | None) -> tf.errors.OpError | None:
    while error is not None and not isinstance(error, tf.errors.OpError):
        error = error.__cause__
    return error


def _over_budget(corrupt: list[CorruptRecord], budget: int) -> str:
    named = "; ".join(
        f"{r.path}: record {r.index} at byte offset {r.offset} (the file's last {r.skipped_bytes} bytes)"
        for r in corrupt[:_MAX_LISTED]
    )
    more = f"; and {len(corrupt) - _MAX_LISTED} more" if len(corrupt) > _MAX_LISTED else ""
    records = "1 corrupt record" if len(corrupt) == 1 else f"{len(corrupt)} corrupt records"
    return (
        f"--train_data has {records} (bad CRC or truncated file), more than --max_bad_records={budget}: "
        f"{named}{more}. Rewrite the file(s), leave them out of --train_data, or raise --max_bad_records to skip "
        "each corrupt record and the rest of its file"
    )
