"""A task's own records (`data.FeatureSchema`): parsing them, checking them, naming the one that is bad.

A record holds one tf.train.Example value per key of the schema: a fixed feature exactly prod(shape) values,
a variable-length one (`Feature.max_length > 0`) up to max_length values, each inside the feature's `bounds`
when it declares them. A record that lacks a key is bad unless the feature is `optional` (variable-length
only): then it reads as an empty list. A key present with an empty list is an empty list, optional or not.

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
from data.options import with_run_options
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
            tf.train.Example or lacks a key of the schema (one not optional), holds it with another dtype, or
            holds a fixed feature with another number of values (or a variable-length one with more than
            max_length), or a value outside the feature's bounds: e.g. "task 'lm': feature 'tokens' of
            data/x.tfrecord holds float_list, the task reads int64".
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
            if feature.optional:
                continue  # declared so: read as an empty list
            return key, missing_problem(feature, features)
        found = features[key].WhichOneof("kind")
        if found is not None and found != kind:
            return key, f"holds {found}, the task reads {feature.dtype}"
        values = getattr(features[key], kind).value
        problem = length_problem(feature, len(values)) or bounds_problem(feature, values)
        if problem is not None:
            return key, problem
    return None


def missing_problem(feature: Feature, features) -> str:
    """What is wrong with a record that lacks `feature`'s key: the keys it has instead (`features`)."""
    found = ", ".join(sorted(features)) or "none"
    hint = "; if records may lack it, declare it Feature(..., optional=True)" if feature.variable else ""
    return f"is missing (keys found: {found}){hint}"


def bounds_problem(feature: Feature, values) -> str | None:
    """What is wrong with a record holding `values` of `feature`: its first value outside the bounds, or None."""
    if feature.bounds is None:
        return None
    low, high = feature.bounds
    for value in values:
        if not low <= value < high:
            shown = value if isinstance(value, int) else f"{value:g}"
            return f"holds {shown}, outside its bounds [{low}, {high})"
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
    lengths), that no variable-length feature is longer than its max_length or lacks its key (unless
    optional), and that every value lies inside its feature's bounds: parsed in batches of 1024, in parallel,
    one flag per record copied to numpy; a batch with a bad record is read again one record at a time.

    Args:
        info: From `inspect_feature_records`.
        what: Names the data in the message ("--eval_data").

    Raises:
        DataError: Naming the task, the feature, the file, the record's index and what is wrong (its length,
            the keys it has instead, its value outside the bounds).
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
    check_batch = _batch_checker(info.schema)
    count = 0
    for path in info.files:
        records, bad = _search_file(path, check_batch, info.schema)
        count += records
        if bad is not None and not (skip_corrupt and bad[1]):
            return count, bad
    return count, None


def has_key(serialized: tf.Tensor, key: str) -> tf.Tensor:
    """bool [B]: whether each serialized tf.train.Example [B] holds `key` (even as an empty list, which parsing
    cannot tell from a missing key): its map's keys, decoded in the graph."""
    _, (features,) = tf.io.decode_proto(serialized, "tensorflow.Example", ["features"], [tf.string])
    features = tf.pad(features, [[0, 0], [0, 1]], constant_values="")[:, 0]  # [B, 0] if no record has features
    _, (entries,) = tf.io.decode_proto(features, "tensorflow.Features", ["feature"], [tf.string])
    _, (keys,) = tf.io.decode_proto(entries, "tensorflow.Features.FeatureEntry", ["key"], [tf.string])
    return tf.reduce_any(tf.equal(keys[..., 0], key), axis=-1)


def missing(schema: FeatureSchema, key: str, lengths: tf.Tensor, serialized: tf.Tensor) -> tf.Tensor:
    """bool [B]: which records lack the non-optional variable-length `key` (False for other features). The
    decode runs only for a batch with an empty list of it (an empty list reads as a missing key)."""
    feature = schema.as_dict()[key]
    if feature.optional or not feature.variable:
        return tf.zeros_like(lengths, tf.bool)
    empty = tf.equal(lengths, 0)
    return tf.cond(
        tf.reduce_any(empty),
        lambda: tf.logical_and(empty, tf.logical_not(has_key(serialized, key))),
        lambda: tf.zeros_like(empty),
    )


def out_of_bounds(feature: Feature, values) -> tf.Tensor:
    """bool [B]: which records of a batch ([B, ...] dense or [B, None] ragged `values`) hold a value outside
    the feature's bounds (False everywhere without bounds)."""
    low, high = feature.bounds
    outside = tf.logical_not(tf.logical_and(values >= tf.cast(low, values.dtype), values < tf.cast(high, values.dtype)))
    if isinstance(outside, tf.RaggedTensor):
        return tf.reduce_any(outside, axis=1)
    return tf.reduce_any(tf.reshape(outside, [tf.shape(outside)[0], -1]), axis=1)


def _batch_checker(schema: FeatureSchema):
    """`check(serialized [B]) -> (bool [B], payload bytes)`: which records are bad (too long, outside their
    bounds, lacking a key); a batch that does not parse fails the op (a fixed feature's tensor is used)."""
    spec = parse_spec(schema)

    def check(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        bad = tf.zeros(tf.shape(serialized), tf.bool)
        for key, f in schema.features:
            if f.variable:
                lengths = parsed[key].row_lengths()
                bad |= (lengths > f.max_length) | missing(schema, key, lengths, serialized)
            if f.bounds is not None:
                bad |= out_of_bounds(f, parsed[key])
        # The parse must run even when no output is used (fixed features without bounds): it checks them.
        with tf.control_dependencies(tf.nest.flatten(parsed, expand_composites=True)):
            payload = tf.reduce_sum(tf.strings.length(serialized, unit="BYTE"))
        return bad, tf.cast(payload, tf.int64)

    return check


def _search_file(path: str, check_batch, schema: FeatureSchema) -> tuple[int, tuple[str, bool] | None]:
    """(records read, the first bad record or None) of one file; its bytes are counted, as `data.check` does:
    TFRecordDataset stops without an error where a file ends inside a record's header. A batch with a bad
    record is read again one record at a time, to name it and say what is wrong."""
    batches = with_run_options(tf.data.TFRecordDataset(path).batch(_CHECK_BATCH))
    batches = batches.map(
        tf.autograph.experimental.do_not_convert(check_batch), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    records = offset = 0
    try:
        for bad, payload in batches:
            if np.any(bad.numpy()):
                found = _bad_in_batch(path, records, schema)
                if found is not None:
                    return records, found
            batch = int(tf.size(bad))
            records, offset = records + batch, offset + int(payload) + FRAME_BYTES * batch
    except tf.errors.OpError:
        return records, _bad_in_batch(path, records, schema)
    size = tf.io.gfile.stat(path).length
    if offset == size:
        return records, None
    return records, (f"task '{schema.task}': file {path} ends {size - offset} bytes into record {records}", True)


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
