"""A task's own records (`data.FeatureSchema`): parsing them, checking them, naming the one that is bad.

A record holds one tf.train.Example value per key of the schema: a fixed feature exactly prod(shape) values,
a variable-length one (`Feature.max_length > 0`) up to max_length values. A record that lacks a variable-length
key reads as an empty list of it (tf.train.Example cannot tell the two apart); one that lacks a fixed key does
not parse.

Every message about a bad record names the task, the feature and the file: "task 'lm': feature 'tokens' of
data/x.tfrecord record 17 has 52 values, more than its max_length 40". `check_feature_records` reads every
record once, parsed in batches (only the lengths come back to Python); a batch that does not parse is read
again one record at a time to name the record. `find_bad_feature_record` is that search for
`data.integrity.BadRecords.explain`, after a pipeline failed.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from google.protobuf import message as protobuf_message

from data import check
from data.inspect import list_files, read_first_example
from data.schema import FRAME_BYTES, DataError, Feature, FeatureSchema, RecordInfo

KINDS = {"int64": "int64_list", "float32": "float_list", "string": "bytes_list"}
DTYPES = {"int64": tf.int64, "float32": tf.float32, "string": tf.string}
# Records per parse of the check: large batches make the per-batch cost (a tf.data element, a copy of the
# lengths to numpy) small against the parse itself.
_CHECK_BATCH = 1024


def parse_spec(schema: FeatureSchema) -> dict:
    """The tf.io parse spec of the schema: a variable-length feature as a ragged list, a fixed one dense."""
    return {
        key: tf.io.RaggedFeature(DTYPES[f.dtype], row_splits_dtype=tf.int64)
        if f.variable
        else tf.io.FixedLenFeature(f.shape, DTYPES[f.dtype])
        for key, f in schema.features
    }


def inspect_feature_records(pattern: str, schema: FeatureSchema, what: str = "data") -> RecordInfo:
    """Finds the files and checks the first record of every one of them against the task's schema.

    Args:
        pattern: File glob(s), as for `data.list_files`.
        schema: The task's features (`FeatureSchema.of(task.features(), task.name)`).
        what: The flag the pattern came from, for error messages ("train_data" or "--train_data").

    Returns:
        A RecordInfo with the schema, example_shape () and the files.

    Raises:
        DataError: If no file matches, a file is empty or not a TFRecord file, or its first record is not a
            tf.train.Example or lacks a key of the schema, holds it with another dtype, or holds a fixed
            feature with another number of values (or a variable-length one with more than max_length):
            e.g. "task 'lm': feature 'tokens' of data/x.tfrecord is a float_list, the task reads int64".
    """
    files = list_files(pattern, what=what)
    for path in files:
        problem = example_problem(read_first_example(path).features.feature, schema)
        if problem is not None:
            key, text = problem
            raise DataError(f"task '{schema.task}': feature '{key}' of {path} {text}")
    return RecordInfo(schema=schema, example_shape=(), files=files)


def example_problem(features, schema: FeatureSchema) -> tuple[str, str] | None:
    """(key, what is wrong) with one record's features (a tf.train.Example's `features.feature`), or None."""
    for key, feature in schema.features:
        kind = KINDS[feature.dtype]
        if key not in features:
            if feature.variable:
                continue  # an empty list is not written at all by some writers: read as empty
            found = ", ".join(sorted(features)) or "none"
            return key, f"is missing (keys found: {found})"
        found = features[key].WhichOneof("kind")
        if found is not None and found != kind:
            return key, f"holds {found}, the task reads {feature.dtype}"
        count = len(getattr(features[key], kind).value)
        problem = length_problem(feature, count)
        if problem is not None:
            return key, problem
    return None


def length_problem(feature: Feature, count: int) -> str | None:
    """What is wrong with a record holding `count` values of `feature`, or None."""
    if feature.variable:
        too_long = f"has {count} values, more than its max_length {feature.max_length}"
        return None if count <= feature.max_length else too_long
    expected = int(np.prod(feature.shape))
    return None if count == expected else f"has {count} values, the task reads {expected} (shape {feature.shape})"


def check_feature_records(info: RecordInfo, what: str = "data") -> int:
    """Reads every record of `info.files` once; returns how many there are.

    Checks every record's framing (CRC, truncation), that it parses with the schema (keys, dtypes, fixed
    lengths) and that no variable-length feature is longer than its max_length: parsed in batches of 1024,
    in parallel, only the lengths copied to numpy.

    Args:
        info: From `inspect_feature_records`.
        what: Names the data in the message ("--eval_data").

    Raises:
        DataError: Naming the task, the feature, the file, the record's index and what is wrong (its length).
    """
    count, bad = _search(info, skip_corrupt=False)
    if bad is not None:
        raise DataError(f"{bad[0]} ({'--' + what.lstrip('-')})")
    return count


def find_bad_feature_record(info: RecordInfo, skip_corrupt: bool) -> str | None:
    """The first record of `info.files` that stops a pipeline, as a message naming it, or None.

    Args:
        info: The files and the schema.
        skip_corrupt: Go on with the next file at a damaged frame, as a training pipeline with a budget does.
    """
    bad = _search(info, skip_corrupt)[1]
    return None if bad is None else bad[0]


def _search(info: RecordInfo, skip_corrupt: bool) -> tuple[int, tuple[str, bool] | None]:
    """(records read, (message, corrupt) of the first bad record or None)."""
    lengths_of = _length_parser(info.schema)
    count = 0
    for path in info.files:
        records, bad = _search_file(path, lengths_of, info.schema)
        count += records
        if bad is not None and not (skip_corrupt and bad[1]):
            return count, bad
    return count, None


def _length_parser(schema: FeatureSchema):
    """`lengths(serialized [B]) -> ({key: int64 [B]}, payload bytes)`: each record's number of values."""
    spec = parse_spec(schema)

    def lengths(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        # A fixed feature's count is its size, or the batch did not parse (its tensor is used: not pruned).
        counts = {
            key: parsed[key].row_lengths() if f.variable else tf.fill(tf.shape(parsed[key])[:1], int(np.prod(f.shape)))
            for key, f in schema.features
        }
        payload = tf.reduce_sum(tf.strings.length(serialized, unit="BYTE"))
        return {key: tf.cast(c, tf.int64) for key, c in counts.items()}, tf.cast(payload, tf.int64)

    return lengths


def _search_file(path: str, lengths_of, schema: FeatureSchema) -> tuple[int, tuple[str, bool] | None]:
    """(records read, the first bad record or None) of one file; its bytes are counted, as `data.check` does:
    TFRecordDataset stops without an error where a file ends inside a record's header."""
    batches = tf.data.TFRecordDataset(path).batch(_CHECK_BATCH)
    batches = batches.map(lengths_of, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    records = offset = 0
    try:
        for counts, payload in batches:
            long = _too_long(schema, {key: c.numpy() for key, c in counts.items()})
            if long is not None:
                key, index, text = long
                return records, (_named(schema, key, path, records + index, text), False)
            batch = len(next(iter(counts.values())))
            records, offset = records + batch, offset + int(payload) + FRAME_BYTES * batch
    except tf.errors.OpError:
        return records, _bad_in_batch(path, records, schema)
    size = tf.io.gfile.stat(path).length
    if offset == size:
        return records, None
    return records, (f"task '{schema.task}': file {path} ends {size - offset} bytes into record {records}", True)


def _too_long(schema: FeatureSchema, counts: dict[str, np.ndarray]) -> tuple[str, int, str] | None:
    """(key, index in the batch, problem) of the batch's first record with a too-long feature, or None."""
    firsts = []
    for key, feature in schema.features:
        if feature.variable and counts[key].size and counts[key].max() > feature.max_length:
            index = int(np.argmax(counts[key] > feature.max_length))
            firsts.append((index, key, length_problem(feature, int(counts[key][index]))))
    if not firsts:
        return None
    index, key, text = min(firsts)
    return key, index, text


def _named(schema: FeatureSchema, key: str, path: str, index: int, text: str) -> str:
    return f"task '{schema.task}': feature '{key}' of {path} record {index} {text}"


def _bad_in_batch(path: str, start: int, schema: FeatureSchema) -> tuple[str, bool] | None:
    """The failed batch starting at record `start`, read one record at a time: (message, corrupt) of the first
    bad record; None if each reads and checks out alone (the failure was not the data's)."""
    try:
        for index, _, record in check.scan_file(path, stop_after=start + _CHECK_BATCH - 1):
            if index < start:
                continue
            try:
                features = tf.train.Example.FromString(record).features.feature
            except protobuf_message.DecodeError as e:
                return f"task '{schema.task}': {path} record {index} is not a serialized tf.train.Example ({e})", False
            problem = example_problem(features, schema)
            if problem is not None:
                return _named(schema, problem[0], path, index, problem[1]), False
    except check.Corrupt as e:  # data.check's search signal
        return f"task '{schema.task}': {path} record {e.index} at byte offset {e.offset} is corrupt ({e.reason})", True
    except tf.errors.OpError as e:
        return f"task '{schema.task}': {path} cannot be read (TensorFlow: {check.first_line(e.message)})", False
    return None
