"""The vocabulary split over tensor-parallel shards, as Megatron-LM's vocabulary-parallel layers: the embedding
by rows, the output head by columns, and the cross-entropy and arg-max computed on the head's shards, so no device
holds a micro-batch's whole logits. Built on `models.sharded` (placement, the fixed tree, each shard's own pass);
with one shard the built-in Transformer uses Keras's own layers instead (`models.transformer`)."""

from __future__ import annotations

import keras
import tensorflow as tf

from models.sharded import dense_parts, on_shard, run, tagged, to_shards, tree


class VocabEmbedding(keras.layers.Layer):
    """An Embedding of ``vocab`` rows kept as ``shards`` slices of rows: shard k looks up the ids in its range
    (others give zeros), and the shards' rows are added along the tree (one of them is not zero)."""

    def __init__(self, vocab: int, width: int, shards: int, **kwargs):
        super().__init__(**kwargs)
        self.shards, self.rows = shards, vocab // shards
        self.parts = [
            tagged(keras.layers.Embedding(self.rows, width, name=f"{self.name}_shard_{k}"), k) for k in range(shards)
        ]

    def call(self, ids):
        found = [run(k, self.shards, self._lookup(k, ids), (), (part,)) for k, part in enumerate(self.parts)]
        return tree(found)

    def _lookup(self, shard: int, ids):
        def lookup():
            local = ids - shard * self.rows
            inside = tf.logical_and(local >= 0, local < self.rows)
            rows = self.parts[shard](tf.where(inside, local, 0))
            return rows * tf.cast(inside, rows.dtype)[..., None]

        return lookup


class VocabHead(keras.layers.Layer):
    """The output head (no bias) kept as ``shards`` slices of the vocabulary: gives each shard's logits, float32,
    on its device. No device holds a micro-batch's whole logits: ``cross_entropy`` and ``argmax`` work on them."""

    def __init__(self, vocab: int, shards: int, **kwargs):
        super().__init__(**kwargs)
        self.shards = shards
        self.parts = dense_parts(self.name, vocab // shards, shards, use_bias=False)

    def call(self, x):
        copies = to_shards(x, self.shards)
        return tuple(
            run(k, self.shards, lambda x, part=part: tf.cast(part(x), tf.float32), (copies[k],), (part,))
            for k, part in enumerate(self.parts)
        )


def cross_entropy(logits, targets):
    """Per-position cross-entropy of integer ``targets`` [B, T] under ``logits``: one tensor [B, T, V], or a
    tuple of vocabulary shards. Over shards, as Megatron's vocabulary-parallel cross-entropy: each shard's
    maximum, sum of exponentials and target logit on its device, combined by the tree; what crosses devices is
    a few scalars per position, not logits."""
    if not isinstance(logits, tuple):
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
    shards, size = len(logits), logits[0].shape[-1]
    maxima = []
    for k, part in enumerate(logits):
        with on_shard(k, shards):
            maxima.append(tf.reduce_max(part, axis=-1))
    top = tf.stop_gradient(tree(maxima, tf.maximum))  # the loss's value and gradient do not depend on it
    sums, picked = [], []
    for k, part in enumerate(logits):
        summed, chosen = run(k, shards, _softmax_parts(k, size, targets), (part, top))
        sums.append(summed)
        picked.append(chosen)
    return tf.math.log(tree(sums)) + top - tree(picked)


def _softmax_parts(shard: int, size: int, targets):
    """(sum of exp(logits - top), the target's logit or 0) of one vocabulary shard's logits."""

    def parts(logits, top):
        local = targets - shard * size
        inside = tf.logical_and(local >= 0, local < size)
        chosen = tf.gather(logits, tf.where(inside, local, 0)[..., None], batch_dims=2)[..., 0]
        return tf.reduce_sum(tf.exp(logits - top[..., None]), axis=-1), tf.where(inside, chosen, 0.0)

    return parts


def argmax(logits):
    """The arg-max over the vocabulary (int32 [B, T]) of one tensor or of its shards; on a tie, the lowest id, as
    ``tf.argmax``."""
    if not isinstance(logits, tuple):
        return tf.argmax(logits, axis=-1, output_type=tf.int32)
    shards, size = len(logits), logits[0].shape[-1]
    best = []
    for k, part in enumerate(logits):
        with on_shard(k, shards):
            best.append((tf.reduce_max(part, axis=-1), tf.argmax(part, axis=-1, output_type=tf.int32) + k * size))

    def higher(a, b):  # a holds the lower ids: it wins a tie
        keep = a[0] >= b[0]
        return tf.where(keep, a[0], b[0]), tf.where(keep, a[1], b[1])

    return tree(best, higher)[1]


def whole(logits):
    """The logits as one tensor [..., V] (shards concatenated in order): for serving, on one device."""
    return tf.concat(logits, axis=-1) if isinstance(logits, tuple) else logits
