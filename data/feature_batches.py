"""Batches of a task's examples: variable lengths padded to buckets, optionally grouped by length.

`padded_batches` pads each batch to its longest, then to the smallest of the feature's buckets holding it.
`grouped_batches` (length grouping, "bucketing" proper) first sorts pools of consecutive examples by length,
so a batch holds examples of similar lengths and less padding; its positions carry one more number.
"""

from __future__ import annotations

import tensorflow as tf

from data.pipeline import IN_ORDER
from data.schema import DataError, Feature, FeatureSchema

LENGTH_SUFFIX = "_length"


def padded_keys(schema: FeatureSchema, outputs: dict) -> tuple[dict[str, Feature], list[str]]:
    """({output key: the feature it is padded as}, what is wrong), as `data.feature_pipeline` says; `outputs`
    holds tensors or their specs."""
    features = schema.as_dict()
    variable = [key for key, f in schema.features if f.variable]
    padded, problems = {}, []
    for key, value in outputs.items():
        if key in features and features[key].variable:
            if value.shape.rank != 1:
                problems.append(f"task '{schema.task}': preprocess output '{key}' has shape {value.shape}, not 1-D")
            padded[key] = features[key]
        elif value.shape.rank is None or None in value.shape.as_list():
            if value.shape.rank != 1 or len(variable) != 1:
                problems.append(
                    f"task '{schema.task}': preprocess output '{key}' has shape {value.shape}: only 1-D outputs "
                    f"may vary in length, named after the variable-length feature they follow ({variable})"
                )
            else:
                padded[key] = features[variable[0]]
    return padded, problems


def padded_batches(examples: tf.data.Dataset, schema: FeatureSchema, batch_size: int, drop: bool):
    """(batch dict, position int64 [2]) batches of (outputs, position) examples, the position the last
    example's: each padded output padded with its feature's pad to the batch's longest, then to the smallest
    bucket that holds it."""
    padded = padded_keys(schema, examples.element_spec[0])[0]
    batches = examples.padded_batch(batch_size, drop_remainder=drop, padding_values=_padding_values(examples, padded))
    return batches.map(lambda batch, positions: (_to_buckets(schema, padded, batch), positions[-1]), **IN_ORDER)


def grouped_batches(
    examples: tf.data.Dataset, schema: FeatureSchema, batch_size: int, pool_batches: int, pool_key: tf.Tensor, skip: int
):
    """(batch dict, position int64 [3]) batches of (outputs, position) examples grouped by length.

    Each pool of `pool_batches * batch_size` consecutive examples is sorted by length (the longest padded
    output of each example; stable), cut into `pool_batches` batches, and the batches' order shuffled keyed on
    (`pool_key`, the pool's start). A batch's position is (epoch, record) where its pool starts and how many
    of the pool's batches are done, or, after a pool's last batch, (epoch, record) after it and 0: resuming
    from it (`skip` = its third element) rebuilds the pool and skips the batches done.
    """
    padded = padded_keys(schema, examples.element_spec[0])[0]
    if not padded:
        raise DataError(f"task '{schema.task}': grouping by length needs an output of variable length")
    pool = batch_size * pool_batches
    pools = examples.padded_batch(pool, drop_remainder=True, padding_values=_padding_values(examples, padded))

    def cut(outputs, positions):
        lengths = tf.reduce_max(tf.stack([outputs[key + LENGTH_SUFFIX] for key in padded], axis=1), axis=1)
        start = positions[0] - tf.constant([0, 1], tf.int64)  # before the pool's first record
        seed = tf.random.experimental.stateless_fold_in(
            tf.random.experimental.stateless_fold_in(pool_key, start[0]), start[1]
        )
        batch_order = tf.random.experimental.stateless_shuffle(tf.range(pool_batches), seed=seed)
        rows = tf.gather(tf.reshape(tf.argsort(lengths, stable=True), [pool_batches, batch_size]), batch_order)
        done = tf.range(1, pool_batches + 1, dtype=tf.int64)[:, None]
        mid = tf.concat([tf.tile(start[None], [pool_batches, 1]), done], axis=1)
        end = tf.concat([positions[-1], [0]], axis=0)
        after = tf.where(done < pool_batches, mid, end[None])
        return {key: tf.gather(value, rows) for key, value in outputs.items()}, after

    batches = pools.map(cut, **IN_ORDER).unbatch().skip(skip)
    # Positions per batch: the last batch's is a checkpoint's, the others' are resumable too.
    return batches.map(lambda batch, position: (_to_buckets(schema, padded, batch, trim=True), position), **IN_ORDER)


def _padding_values(examples: tf.data.Dataset, padded: dict[str, Feature]):
    outputs = examples.element_spec[0]
    values = {key: _pad_of(padded.get(key), spec.dtype) for key, spec in outputs.items()}
    return values, tf.constant(0, tf.int64)


def _to_buckets(schema: FeatureSchema, padded: dict[str, Feature], batch: dict, trim: bool = False) -> dict:
    """The batch, its padded outputs padded to their buckets (`trim`: first cut to the batch's longest)."""
    batch = dict(batch)
    for key, feature in padded.items():
        values = batch[key][:, : tf.reduce_max(batch[key + LENGTH_SUFFIX])] if trim else batch[key]
        batch[key] = _to_bucket(schema.task, key, feature, values)
    return batch


def _to_bucket(task: str, key: str, feature: Feature, values: tf.Tensor) -> tf.Tensor:
    """[B, longest] values padded to [B, the smallest bucket >= longest] with the feature's pad."""
    buckets = tf.constant(feature.buckets, tf.int32)
    longest = tf.shape(values)[1]
    index = tf.reduce_sum(tf.cast(buckets < longest, tf.int32))
    last = feature.buckets[-1]
    message = f"task {task}: preprocess output {key} is longer than the last bucket of its feature, {last}:"
    with tf.control_dependencies([tf.debugging.Assert(index < len(feature.buckets), [message, longest])]):
        target = tf.gather(buckets, tf.minimum(index, len(feature.buckets) - 1))
    padding = tf.stack([tf.constant([0, 0]), tf.stack([0, target - longest])])
    return tf.pad(values, padding, constant_values=_pad_of(feature, values.dtype))


def _pad_of(feature: Feature | None, dtype: tf.DType) -> tf.Tensor:
    """The value padding an output of `dtype` (the output's, which preprocess may have cast): its feature's
    pad, b"" for strings, 0 for an output that is not padded (padded_batch wants one for every component)."""
    if dtype == tf.string:
        return tf.constant(b"")
    return tf.cast(feature.pad if feature is not None else 0, dtype)
