"""The vocabulary split over tensor-parallel shards, as Megatron-LM's vocabulary-parallel layers: the embedding
by rows, the output head by columns, and the cross-entropy and arg-max computed on the head's shards, so no device
holds a micro-batch's whole logits. Built on `models.sharded` (placement, the fixed tree, each shard's own pass);
with one shard the built-in Transformer uses Keras's own layers instead (`models.transformer`).

A vocabulary the shard count does not divide is padded, as Megatron-LM pads it (`--make-vocab-size-divisible-by`,
here to a multiple of the shards only): each shard holds ceil(V/N) rows, the last ones no token uses. No id
looks them up, and the head masks their logits to ``PADDED`` on their shard's device, so they take no part in
the softmax (the loss is the unpadded vocabulary's V-way cross-entropy, and their columns get no gradient), the
arg-max never picks them, and ``whole(logits, V)`` drops them before anything is served. A vocabulary the
shards divide has no padding and no mask: the model is the one without this."""

from __future__ import annotations

import keras
import tensorflow as tf

from models.sharded import dense_parts, on_shard, run, tagged, to_shards, tree

PADDED = -1e9  # a padded row's logit, float32: exp() of it less any real logit is 0, and no arg-max picks it


def padded(vocab: int, shards: int) -> int:
    """The rows ``vocab`` takes over ``shards`` equal shards: the next multiple of ``shards``."""
    return -(-vocab // shards) * shards


def padding(model) -> dict | None:
    """What padding the model's vocabulary embedding added ({"vocabulary", "padded", "shards", "rows",
    "parameters"}: the padded rows of the embedding and the head, counted at their width), or None."""
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, VocabEmbedding) and layer.vocab < layer.rows * layer.shards:
            rows = layer.rows * layer.shards - layer.vocab
            share = {"vocabulary": layer.vocab, "padded": layer.rows * layer.shards, "shards": layer.shards}
            return {**share, "rows": rows, "parameters": 2 * rows * layer.width}
    return None


def describe_padding(facts: dict) -> str:
    """`vocabulary 103 padded to 104 for 4 shards (+1 row: 0.97% of the embedding and the head, +256
    parameters); never a target, masked out of the softmax`: the banner's line."""
    rows, share = facts["rows"], 100 * facts["rows"] / facts["padded"]
    return (
        f"vocabulary {facts['vocabulary']} padded to {facts['padded']} for {facts['shards']} shards "
        f"(+{rows} row{'' if rows == 1 else 's'}: {share:.2g}% of the embedding and the head, "
        f"+{facts['parameters']:,} parameters); never a target, masked out of the softmax"
    )


class VocabEmbedding(keras.layers.Layer):
    """An Embedding of ``vocab`` rows kept as ``shards`` slices of ceil(vocab/shards) rows (the last padded,
    never looked up): shard k looks up the ids in its range (others give zeros), and the shards' rows are added
    along the tree (one of them is not zero)."""

    def __init__(self, vocab: int, width: int, shards: int, **kwargs):
        super().__init__(**kwargs)
        self.vocab, self.width, self.shards, self.rows = vocab, width, shards, padded(vocab, shards) // shards
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
    """The output head (no bias) kept as ``shards`` slices of the (padded) vocabulary: gives each shard's
    logits, float32, on its device, a padded column's ``PADDED``. No device holds a micro-batch's whole logits:
    ``cross_entropy`` and ``argmax`` work on them."""

    def __init__(self, vocab: int, shards: int, **kwargs):
        super().__init__(**kwargs)
        self.vocab, self.shards, self.rows = vocab, shards, padded(vocab, shards) // shards
        self.parts = dense_parts(self.name, self.rows, shards, use_bias=False)

    def call(self, x):
        copies = to_shards(x, self.shards)
        return tuple(run(k, self.shards, self._logits(k), (copies[k],), (part,)) for k, part in enumerate(self.parts))

    def _logits(self, shard: int):
        """Shard k's logits; where it holds padded columns, ``PADDED`` in them (no gradient reaches them)."""
        real = min(max(self.vocab - shard * self.rows, 0), self.rows)

        def logits(x):
            found = tf.cast(self.parts[shard](x), tf.float32)
            if real == self.rows:
                return found
            return tf.where(tf.range(self.rows) < real, found, tf.constant(PADDED, tf.float32))

        return logits


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


def whole(logits, vocab: int):
    """The logits as one tensor [..., vocab] (shards concatenated in order, the padded columns dropped): for
    serving, on one device."""
    if not isinstance(logits, tuple):
        return logits
    joined = tf.concat(logits, axis=-1)
    return joined if joined.shape[-1] == vocab else joined[..., :vocab]
