"""The tf.data pipelines of a task's records (`data.FeatureSchema`): batches as dicts, variable lengths padded.

The twins of `data.training_dataset` and `data.eval_dataset`, over the same record order (`data.order`), the
same bad-record budget (`data.BadRecords`) and the same options. Each record is parsed to a dict (a
variable-length feature a 1-D tensor of its true length, a fixed one with its shape), then the task's
`preprocess(example, seed, training)` runs once per example:

- `seed` (int32 [2], for `tf.random.stateless_*`) depends on (stream.seed, stream.worker_index, epoch, record
  index) alone: `data.augment.example_key` of the record's position in its stream, the position a resume
  restarts from. So an example gets the same draws on a rerun, after a resume, and whatever the towers or the
  parallelism of the map. Streams differ by worker_index by design. Eval records are at epoch -1 (never a
  training epoch), record = their index in this worker's eval records.
- Its output keys, dtypes and ranks are static (one trace). Which outputs are padded: every output whose key
  is a variable-length feature's, padded with that feature's `pad` to the smallest of its `buckets` that holds
  the batch's longest; and any other 1-D output of unknown length, padded as the schema's only variable-length
  feature (a schema with several refuses such an output: name it after the feature it follows). Each padded
  output `k` gets `k_length`, int32 [B], its true lengths. So a batch has at most len(buckets) shapes.

A record whose variable-length feature holds more than max_length values, lacks a key that is not optional,
or holds a value outside its feature's bounds fails the pipeline (before the model sees it) with an
InvalidArgumentError naming the task and the feature; `BadRecords.explain` turns it into a DataError that
names the file and the record too (`data.features.find_bad_feature_record`).
"""

from __future__ import annotations

import tensorflow as tf

from data import augment as augment_lib
from data import order as order_lib
from data.feature_batches import LENGTH_SUFFIX, grouped_batches, padded_batches, padded_keys
from data.features import missing, out_of_bounds, parse_spec
from data.pipeline import IN_ORDER, Stream, drop_last, finished, registered
from data.schema import DataError, FeatureSchema, RecordInfo

# The epoch of every eval record's seed: training epochs count from 0, so eval seeds are never training's.
EVAL_EPOCH = -1
# Salts the stream's key for the order of a length-grouped pool's batches, apart from the examples' seeds.
_GROUP_SALT = 0x67727570


def feature_training_dataset(
    info: RecordInfo,
    stream: Stream,
    preprocess,
    *,
    resume_from: tuple[int, ...] | None = None,
    group_batches: int = 0,
) -> tf.data.Dataset:
    """This stream's share of the files (`data.order.training_share`) in the seeded order and shuffle of
    `data.training_dataset`, repeated forever, full batches of stream.batch_size dicts.

    Args:
        info: From `data.inspect_feature_records`.
        stream: What to read and how (its `preprocess` and `num_classes` are for images and labels: unused).
        preprocess: `preprocess(example: dict, seed: int32 [2], training=True) -> dict`, once per example.
        resume_from: An (epoch, record) position, as the second element of a batch of this pipeline gave it:
            the dataset then starts there and yields (batch, position int64 [2]), the position after the
            batch's last record, and a resume from it continues bit for bit. Without it, batches alone (as
            `data.training_dataset` yields (features, labels) then).
        group_batches: > 1 groups examples by length (`data.feature_batches.grouped_batches`) in pools of
            this many batches; positions are then (epoch, record, batches done in the pool), int64 [3], and
            `resume_from` one of them. 0 or 1: batches in stream order.

    Raises:
        DataError: If the stream has an image preprocess, or preprocess's outputs cannot be padded.
    """
    _check_stream(stream)
    bad_records = registered(info, stream, training=True)
    share = order_lib.training_share(info.files, stream.worker_index, stream.num_workers)
    key = augment_lib.stream_key(stream.seed, stream.worker_index)
    read = bad_records.chunk_reader(info)
    grouped = group_batches > 1
    start = (0, 0, 0)[: 2 + grouped] if resume_from is None else tuple(int(v) for v in resume_from)
    if len(start) != 2 + grouped:
        raise DataError(f"resume_from {resume_from} is not a position of this pipeline (group_batches={group_batches})")
    records = order_lib.training_records(share, stream.seed, stream.shuffle_buffer, read, start[:2])
    # The position (e, i + 1) of `training_records`: the one the image pipeline keys its augmentation on.
    examples = _mapped(records, _example_maker(info.schema, preprocess, key, True))
    if grouped:
        pool_key = tf.random.experimental.stateless_fold_in(key, _GROUP_SALT)
        batches = grouped_batches(examples, info.schema, stream.batch_size, group_batches, pool_key, start[2])
    else:
        batches = padded_batches(examples, info.schema, stream.batch_size, drop_last(stream, True))
    if resume_from is None:
        return finished(batches.map(lambda batch, position: batch))
    return finished(batches)


def feature_eval_dataset(info: RecordInfo, stream: Stream, preprocess) -> tf.data.Dataset:
    """This worker's eval records (`data.order.eval_records`), each once, in file order, in batches of
    stream.batch_size dicts (the last maybe short), `preprocess(example, seed, training=False)` on each.

    Raises:
        DataError: As `feature_training_dataset`.
    """
    _check_stream(stream)
    registered(info, stream, training=False)
    key = augment_lib.stream_key(stream.seed, stream.worker_index)
    records = order_lib.eval_records(info.files, stream.worker_index, stream.num_workers)
    at_eval_epoch = lambda make: lambda index, record: make(EVAL_EPOCH, (index, record))
    examples = _mapped(records.enumerate(), _example_maker(info.schema, preprocess, key, False), at_eval_epoch)
    batches = padded_batches(examples, info.schema, stream.batch_size, drop_last(stream, False))
    return finished(batches.map(lambda batch, position: batch))


def example_seed(stream_key: tf.Tensor, position: tf.Tensor) -> tf.Tensor:
    """The preprocess seed of the example at `position` = (epoch, record) of the stream keyed `stream_key`:
    int32 [2], two full-range draws keyed on `data.augment.example_key`."""
    key = augment_lib.example_key(stream_key, position)
    return tf.random.stateless_uniform([2], key, minval=None, maxval=None, dtype=tf.int32)


def _check_stream(stream: Stream) -> None:
    if stream.preprocess is not None:
        raise DataError("a task's records take the task's preprocess, not an image Preprocess (Stream.preprocess)")


def _example_maker(schema: FeatureSchema, preprocess, stream_key: tf.Tensor, training: bool):
    """(make, problems): `make(epoch, (record index, serialized)) -> (outputs, position int64 [2])`, one
    example parsed, its lengths checked, preprocessed, each output to pad given its `_length`; `problems`, what
    tracing `make` found wrong with preprocess's outputs (raised by `_mapped`: an exception raised while
    tf.data traces reaches the caller as autograph's StagingError, not as a DataError)."""
    spec = parse_spec(schema)
    problems = []

    def make(epoch, pair):
        index, serialized = pair
        position = tf.stack([tf.cast(epoch, tf.int64), tf.cast(index, tf.int64)])
        example = _checked(schema, tf.io.parse_single_example(serialized, spec), serialized)
        outputs = dict(preprocess(example, example_seed(stream_key, position), training=training))
        padded, found = padded_keys(schema, outputs)
        problems.extend(found)
        for key in padded:
            if key + LENGTH_SUFFIX in outputs:
                problems.append(f"task '{schema.task}': preprocess returned '{key}{LENGTH_SUFFIX}', which padding adds")
            outputs[key + LENGTH_SUFFIX] = tf.shape(outputs[key], out_type=tf.int32)[0]
        return outputs, position

    return make, problems


def _mapped(records: tf.data.Dataset, make_and_problems, wrap=None) -> tf.data.Dataset:
    """`records.map(make)` (through `wrap(make)`), or the DataError tracing `make` found."""
    make, problems = make_and_problems
    examples = records.map(tf.autograph.experimental.do_not_convert(wrap(make) if wrap else make), **IN_ORDER)
    if problems:
        raise DataError(problems[0])
    return examples


def _checked(schema: FeatureSchema, example: dict, serialized: tf.Tensor) -> dict:
    """The example, asserted to be good: each variable-length feature holds at most max_length values and is
    present unless optional, each feature with bounds holds values inside them. The pipeline fails at a bad
    record; `BadRecords.explain` then names it (no quotes in the messages: TensorFlow escapes them)."""
    checked = dict(example)
    for key, feature in schema.features:
        asserts = []
        if feature.variable:
            length = tf.size(example[key])
            message = f"task {schema.task}: feature {key} holds more than its max_length {feature.max_length}:"
            asserts.append(tf.debugging.Assert(length <= feature.max_length, [message, length]))
            lacks = missing(schema, key, tf.reshape(length, [1]), tf.reshape(serialized, [1]))[0]
            message = f"task {schema.task}: feature {key} is missing"
            asserts.append(tf.debugging.Assert(tf.logical_not(lacks), [message]))
        if feature.bounds is not None:
            outside = out_of_bounds(feature, tf.reshape(example[key], [1, -1]))[0]
            low, high = feature.bounds
            message = f"task {schema.task}: feature {key} holds a value outside its bounds [{low}, {high})"
            asserts.append(tf.debugging.Assert(tf.logical_not(outside), [message]))
        if asserts:
            with tf.control_dependencies(asserts):
                checked[key] = tf.identity(example[key])
    return checked
