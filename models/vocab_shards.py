"""The vocabulary split over tensor-parallel shards, as Megatron-LM's vocabulary-parallel layers: the embedding
by rows, the output head by columns, and the cross-entropy and arg-max computed on the head's shards, so no device
holds a micro-batch's whole logits. Built on `models.sharded` (placement, the fixed tree, each shard's own pass);
applied to a model's Embedding and output head by a plan's "vocabulary" (`models.layout`), from their weights.

A vocabulary the shard count does not divide is padded, as Megatron-LM pads it (`--make-vocab-size-divisible-by`,
here to a multiple of the shards only): each shard holds ceil(V/N) rows, the last ones no token uses. No id
looks them up, and the head masks their logits to ``PADDED`` on their shard's device, so they take no part in
the softmax (the loss is the unpadded vocabulary's V-way cross-entropy, and their columns get no gradient), the
arg-max never picks them, and ``whole(logits, V)`` drops them before anything is served. A vocabulary the
shards divide has no padding and no mask: the model is the one without this."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from models.registry import ModelError
from models.sharded import DenseParts, dense_parts, on_shard, run, tagged, to_shards, tree
from models.split_dense import refuse_extras

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


def check(layer, path: str, shards: int, named: str) -> None:
    """Refuses what "vocabulary" cannot split: anything but an Embedding or a Dense head without activation (a
    vocabulary ``shards`` does not divide is padded, never refused)."""
    del shards, named
    embedding = type(layer) is keras.layers.Embedding
    head = type(layer) is keras.layers.Dense and layer.activation is keras.activations.linear
    if not (embedding or head):
        raise ModelError(
            f"layer {path!r} is a {type(layer).__name__}; vocabulary splits an Embedding or an "
            "output head (a Dense layer without bias or activation)"
        )
    refuse_extras(layer, path)


def split_of(layer, shards: int, in_graph: bool = False):
    """The vocabulary split of an Embedding (`VocabEmbedding`) or an output head (`VocabHead`), from its weights.
    ``in_graph``: the head is a node of a functional model's graph, which passes on one tensor per output: its
    shards' logits are gathered there (`whole`), on shard 0's device."""
    if isinstance(layer, keras.layers.Embedding):
        table = layer.embeddings.numpy()
        return VocabEmbedding(table.shape[0], table.shape[1], shards, table=table, name=layer.name)
    kernel, bias = layer.kernel.numpy(), (layer.bias.numpy() if layer.use_bias else None)
    return VocabHead(kernel.shape[1], shards, kernel=kernel, bias=bias, gather=in_graph, name=layer.name)


def _padded_slices(values: np.ndarray, shards: int, axis: int) -> list:
    """``values`` padded with zeros along ``axis`` to a multiple of ``shards``, cut in ``shards`` equal slices."""
    extra = padded(values.shape[axis], shards) - values.shape[axis]
    widths = [(0, extra if i == axis else 0) for i in range(values.ndim)]
    return np.split(np.pad(values, widths), shards, axis=axis)


def _constant(values):
    return lambda shape, dtype=None: tf.constant(values, dtype=dtype)


class VocabEmbedding(keras.layers.Layer):
    """An Embedding of ``vocab`` rows kept as ``shards`` slices of ceil(vocab/shards) rows (the last padded,
    never looked up): shard k looks up the ids in its range (others give zeros), and the shards' rows are added
    along the tree (one of them is not zero). ``table`` [vocab, width]: the slices start as its rows (the padded
    ones as zeros); None, each part's own initializer."""

    split_how = "vocabulary"

    def __init__(self, vocab: int, width: int, shards: int, table=None, **kwargs):
        super().__init__(**kwargs)
        self.vocab, self.width, self.shards, self.rows = vocab, width, shards, padded(vocab, shards) // shards
        starts = ["uniform"] * shards if table is None else [_constant(t) for t in _padded_slices(table, shards, 0)]
        self.parts = [
            tagged(
                keras.layers.Embedding(self.rows, width, embeddings_initializer=start, name=f"{self.name}_shard_{k}"), k
            )
            for k, start in enumerate(starts)
        ]
        self.built = False

    def build(self, input_shape=None):
        for part in self.parts:
            part.build(input_shape)
        self.built = True

    def build_like(self, layer) -> None:
        self.build()

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


class VocabHead(DenseParts, keras.layers.Layer):
    """The output head (its bias too, if any) kept as ``shards`` slices of the (padded) vocabulary: gives each shard's
    logits, float32, on its device, a padded column's ``PADDED``. No device holds a micro-batch's whole logits:
    ``cross_entropy`` and ``argmax`` work on them."""

    split_how = "vocabulary"

    def __init__(self, vocab: int, shards: int, kernel=None, bias=None, gather=False, **kwargs):
        super().__init__(**kwargs)
        self.vocab, self.shards, self.rows, self.gather = vocab, shards, padded(vocab, shards) // shards, gather
        kernels = None if kernel is None else _padded_slices(kernel, shards, 1)
        biases = None if bias is None else _padded_slices(bias, shards, 0)
        self.parts = dense_parts(self.name, self.rows, shards, kernels, biases, use_bias=bias is not None)
        self.built = False  # built (its parts) when first called, or by `build_like`

    def call(self, x):
        copies = to_shards(x, self.shards)
        logits = tuple(run(k, self.shards, self._logits(k), (copies[k],), (part,)) for k, part in enumerate(self.parts))
        if not self.gather:
            return logits
        with on_shard(0, self.shards):
            return whole(logits, self.vocab)

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


def gathered_for(task, model) -> int | None:
    """The vocabulary of ``model``'s head when it is split by vocabulary and ``task`` does not compute on the
    shards (``Task.vocabulary_shards``): its logits are gathered for the task (`for_task`, `served`, the
    banner's line); else None."""
    if getattr(task, "vocabulary_shards", False):
        return None
    heads = [layer for layer in model._flatten_layers(include_self=False) if isinstance(layer, VocabHead)]
    return heads[0].vocab if heads else None


def for_task(task, model, outputs):
    """``outputs`` as ``task`` takes them: a split head's shards gathered into whole logits (`whole`) when
    `gathered_for` says so; anything else as it is."""
    vocab = gathered_for(task, model)
    return outputs if vocab is None else whole(outputs, vocab)


class Gathered(keras.Model):
    """``model`` whose split head's logits come gathered (`whole`): what a task that does not take vocabulary
    shards serves."""

    def __init__(self, model, vocab: int):
        super().__init__(name=model.name)
        self.inner, self.vocab = model, vocab

    def call(self, *args, **kwargs):
        return whole(self.inner(*args, **kwargs), self.vocab)


def served(task, model):
    """The model ``task.serving`` is given: ``model``, or `Gathered` around it (`gathered_for`'s rule)."""
    vocab = gathered_for(task, model)
    return model if vocab is None else Gathered(model, vocab)
