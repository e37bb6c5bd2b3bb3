"""Layers whose weights are cut into a fixed number of shards, for tensor parallelism (``--tensor_parallel``).

A layer too wide for one device is split as Megatron-LM splits it: a *column* layer keeps output columns
[k*U/N, (k+1)*U/N) in shard k, so each shard computes its slice of the outputs from the whole input; a *row*
layer keeps input rows in shard k, so each shard computes a partial product of the whole output, and the N
partials are added. Attention splits by heads (query, key and value by columns, the output projection by rows),
the MLP by columns then rows, the embedding and the output head by vocabulary.

The number of shards N is part of the model (``--tensor_shards``): each shard is its own variable, of the same
shape whatever the devices. Where the shards run is not: ``placed(devices)`` puts shard k on
``devices[k * T // N]`` for the T devices of a tower, and no placement (export, a plain call) runs them all
where the caller is. The ops are the same either way; only their devices change, so a step gives the same
bits at every T dividing N, and a checkpoint does not depend on T. Every sum over shards (a row layer's
partials, the gradient of an input the column shards share, the vocabulary-parallel softmax's denominators) is
one fixed binary tree over shard indices, each node on the device of its first shard: shards a device holds
are added there first, and the order never depends on T.

With N = 1 these layers are Keras's own (``Dense``, ``Embedding``) under the names and with the ops of a model
without shards: its bits and checkpoints are unchanged.
"""

from __future__ import annotations

import contextlib
import threading

import keras
import tensorflow as tf

_where = threading.local()  # .devices: the T devices of the tower whose step is being built, or None


@contextlib.contextmanager
def placed(devices):
    """Shard k of every sharded layer called inside runs on ``devices[k * len(devices) // N]``."""
    previous = getattr(_where, "devices", None)
    _where.devices = tuple(devices) if devices else None
    try:
        yield
    finally:
        _where.devices = previous


def shard_device(shard: int, shards: int) -> str | None:
    """The device shard ``shard`` of ``shards`` runs on under ``placed``, or None (the caller's)."""
    devices = getattr(_where, "devices", None)
    return devices[shard * len(devices) // shards] if devices else None


def on_shard(shard: int, shards: int):
    """A device scope for shard ``shard``; none outside ``placed`` (``tf.device(None)`` would clear the caller's)."""
    device = shard_device(shard, shards)
    return tf.device(device) if device else contextlib.nullcontext()


def _add(a, b):
    # AddN of two: one rounding, as a + b; its gradient passes the sum's gradient on as it is, where Add's
    # reads both inputs' shapes (a padded length is not static), which would send each partial to one device.
    return tf.add_n([a, b])


def tree(parts: list, combine=_add):
    """``combine`` over ``parts`` (part k on shard k's device) along the fixed binary tree: halves, split at the
    middle, each node computed on the device of its first part. One part: itself (no op)."""
    shards = len(parts)

    def node(lo: int, hi: int):
        if hi - lo == 1:
            return parts[lo]
        mid = (lo + hi) // 2
        left, right = node(lo, mid), node(mid, hi)
        with on_shard(lo, shards):
            return combine(left, right)

    return node(0, shards)


def to_shards(x, shards: int) -> list:
    """``x`` copied to each shard's device (Megatron's *f*): the gradient of ``x`` is the tree sum of the
    copies' gradients, so the order in which the column shards' input gradients add up is fixed. One shard:
    ``x`` itself, which a Keras layer of the model without shards takes."""
    if shards == 1:
        return x

    @tf.custom_gradient
    def copy(x):
        # Made where x is: the wrapper tf.custom_gradient puts around the outputs runs there too, and each
        # shard's device then receives x once (a copy made on the shard would travel back to the wrapper).
        copies = [tf.identity(x) for _ in range(shards)]

        def grad(*dys):
            return tree([tf.zeros_like(x) if dy is None else dy for dy in dys])

        return copies, grad

    return list(copy(x))


def run(shard: int, shards: int, fn, inputs: tuple, layers: tuple = ()):
    """``fn(*inputs)`` on shard ``shard``'s device, its backward pass there too.

    A GradientTape builds each gradient op on the device of the scope its ``gradient`` call runs in, not on its
    forward op's: the backward of every shard would run on one device, and, measured here, the weights would
    depend on which devices the forwards had run on. So each shard's part is one op to the outer tape
    (``tf.custom_gradient``) whose gradient ``tf.gradients`` builds beside the forward ops (it colocates them).
    ``layers`` are the Keras layers ``fn`` calls: their weights' current values (a stateless call's) are inputs
    of the part, which is how their gradients leave it.
    """
    weights = [w.value for layer in layers for w in layer.trainable_weights]
    count = len(inputs)
    scope = tf.get_current_name_scope()

    @tf.custom_gradient
    def part(*args):
        outputs = fn(*args[:count])

        def grad(*dys, variables=None):
            # Under "gradient_tape/" + the forward's scope, as the tape names its own gradient ops (which is how
            # the step-memory check finds what a backward reads); an embedding's rows made dense here, on the
            # shard's device, not where the tape gathers the gradients.
            with on_shard(shard, shards), tf.name_scope(f"gradient_tape/{scope}/" if scope else "gradient_tape/"):
                sources = list(args) + list(variables or ())
                grads = tf.gradients(tf.nest.flatten(outputs), sources, grad_ys=list(dys))
                grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
            return (grads[: len(args)], grads[len(args) :]) if variables is not None else grads

        return outputs, grad

    # On the shard's device: tf.custom_gradient wraps the part's inputs, weights and outputs in an op of its own,
    # which would otherwise run on the caller's device and draw every shard's weights and outputs through it.
    with on_shard(shard, shards):
        return part(*inputs, *weights)


def _tag(layer, shard: int):
    layer.shard_index = shard
    return layer


def _dense_parts(name: str, units: int, shards: int, **kwargs) -> list:
    return [_tag(keras.layers.Dense(units, name=f"{name}_shard_{k}", **kwargs), k) for k in range(shards)]


class Column(keras.layers.Layer):
    """A Dense layer of ``units`` outputs kept as ``shards`` column slices (``parts[k]``: outputs
    [k*units/shards, (k+1)*units/shards)); a model calls each part in its shard's `run`."""

    def __init__(self, units: int, shards: int, activation=None, **kwargs):
        super().__init__(**kwargs)
        self.shards = shards
        self.parts = _dense_parts(self.name, units // shards, shards, activation=activation)
        self.built = True  # never called itself: its parts are, inside their shards' passes


class Row(keras.layers.Layer):
    """A Dense layer of ``units`` outputs kept as ``shards`` row slices: part k multiplies its slice of the
    inputs (in its shard's `run`); ``finish`` adds the partial products along the tree and the bias once, on
    shard 0's device."""

    def __init__(self, units: int, shards: int, **kwargs):
        super().__init__(**kwargs)
        self.shards = shards
        self.parts = _dense_parts(self.name, units, shards, use_bias=False)
        self.bias = self.add_weight(shape=(units,), initializer="zeros", name="bias")
        self.built = True  # never called itself: its parts are, inside their shards' passes

    def finish(self, partials: list):
        with on_shard(0, self.shards):
            return tree(partials) + keras.ops.cast(self.bias, partials[0].dtype)


class VocabEmbedding(keras.layers.Layer):
    """An Embedding of ``vocab`` rows kept as ``shards`` slices of rows: shard k looks up the ids in its range
    (others give zeros), and the shards' rows are added along the tree (one of them is not zero)."""

    def __init__(self, vocab: int, width: int, shards: int, **kwargs):
        super().__init__(**kwargs)
        self.shards, self.rows = shards, vocab // shards
        self.parts = [
            _tag(keras.layers.Embedding(self.rows, width, name=f"{self.name}_shard_{k}"), k) for k in range(shards)
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
        self.parts = _dense_parts(self.name, vocab // shards, shards, use_bias=False)

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


def shard_of_variables(model) -> dict:
    """{id(variable): shard index} of the variables of every shard layer in ``model`` (others are not sharded)."""
    shards = {}
    for layer in model._flatten_layers(include_self=False):
        index = getattr(layer, "shard_index", None)
        if index is not None:
            shards.update({id(v): index for v in layer.variables})
    return shards


def shard_count(model) -> int:
    """The largest shard count among ``model``'s shard layers (1: none)."""
    counts = [layer.shards for layer in model._flatten_layers(include_self=False) if hasattr(layer, "parts")]
    return max([c for c in counts if isinstance(c, int)] or [1])
