"""Layers whose weights are cut into a fixed number of shards, for tensor parallelism (``--tensor_parallel``).

A layer too wide for one device is split as Megatron-LM splits it: a *column* layer keeps output columns
[k*U/N, (k+1)*U/N) in shard k, so each shard computes its slice of the outputs from the whole input; a *row*
layer keeps input rows in shard k, so each shard computes a partial product of the whole output, and the N
partials are added. Attention splits by heads (query, key and value by columns, the output projection by rows),
the MLP by columns then rows, the embedding and the output head by vocabulary (`models.vocab_shards`).

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
import numpy as np
import tensorflow as tf
from keras.src.backend import AutocastScope  # no public way to read a variable's value uncast

# .devices: the T devices of the tower whose step is being built, or None; .gathered: (whole, parts) of each
# `gather` made in this placement
_where = threading.local()


@contextlib.contextmanager
def placed(devices):
    """Shard k of every sharded layer called inside runs on ``devices[k * len(devices) // N]``."""
    previous = getattr(_where, "devices", None), getattr(_where, "gathered", None)
    _where.devices, _where.gathered = (tuple(devices) if devices else None), []
    try:
        yield
    finally:
        _where.devices, _where.gathered = previous


def gather(parts: list, shards: int):
    """The shards' outputs concatenated on shard 0's device. Inside `placed`, `parts_of` the result gives the
    parts back, where they are, to a layer of the same placement: a pipeline stage, which differentiates its
    input, runs in a placement of its own, so what it receives is always used whole."""
    with on_shard(0, shards):
        whole = tf.concat(parts, axis=-1)
    gathered = getattr(_where, "gathered", None)
    if gathered is not None:
        gathered.append((whole, list(parts)))
    return whole


def parts_of(x, shards: int) -> list | None:
    """The ``shards`` parts `gather` made ``x`` of in this placement, or None."""
    for whole, parts in getattr(_where, "gathered", None) or ():
        if whole is x and len(parts) == shards:
            return parts
    return None


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
    return _node(lambda lo, hi: parts[lo] if hi - lo == 1 else None, 0, len(parts), len(parts), combine)


def _node(leaf, lo: int, hi: int, shards: int, combine=_add):
    """The fixed tree's node over shards [lo, hi): ``leaf(lo, hi)`` where that gives a value (one shard's, or a
    block of shards already summed), else ``combine`` of its halves on shard lo's device."""
    found = leaf(lo, hi)
    if found is not None:
        return found
    mid = (lo + hi) // 2
    left, right = _node(leaf, lo, mid, shards, combine), _node(leaf, mid, hi, shards, combine)
    with on_shard(lo, shards):
        return combine(left, right)


def to_shards(x, shards: int) -> list:
    """``x`` copied to each shard's device (Megatron's *f*): the gradient of ``x`` is the tree sum of the
    copies' gradients, so the order in which the column shards' input gradients add up is fixed. One shard:
    ``x`` itself, which a Keras layer of the model without shards takes.

    Each device receives ``x`` once (`_blocks`): a device holding several shards gets one copy, which it fans
    out to its shards there; the gradient is summed the same way back, the device's shards first (a node of the
    tree), then the devices' sums along the tree's upper nodes: the same sums, on the same devices, as one copy
    per shard."""
    if shards == 1:
        return x
    blocks = _blocks(shards)

    @tf.custom_gradient
    def copy(x):
        # Made where x is: the wrapper tf.custom_gradient puts around the outputs runs there too, and each
        # device then receives x once (a copy made on the device would travel back to the wrapper).
        copies = [tf.identity(x) for _ in blocks]

        def grad(*dys):
            sums = {block: tf.zeros_like(x) if dy is None else dy for block, dy in zip(blocks, dys, strict=True)}
            return _node(lambda lo, hi: sums.get((lo, hi)), 0, shards, shards)

        return copies, grad

    return [y for block, copied in zip(blocks, copy(x), strict=True) for y in _fan_out(copied, *block, shards)]


def _blocks(shards: int) -> list[tuple[int, int]]:
    devices = getattr(_where, "devices", None)
    return device_blocks(shards, len(devices) if devices else 1)


def device_blocks(shards: int, parallel: int) -> list[tuple[int, int]]:
    """The shards [lo, hi) each of ``parallel`` devices holds (shard k on device k*T//N), when every such block is
    a node of the fixed tree (so T and N powers of two); otherwise one block per shard."""
    owner = [k * parallel // shards for k in range(shards)]
    blocks = [(k, k + owner.count(owner[k])) for k in range(shards) if k == 0 or owner[k] != owner[k - 1]]
    nodes = set()

    def walk(lo: int, hi: int) -> None:
        nodes.add((lo, hi))
        if hi - lo > 1:
            walk(lo, (lo + hi) // 2)
            walk((lo + hi) // 2, hi)

    walk(0, shards)
    return blocks if all(block in nodes for block in blocks) else [(k, k + 1) for k in range(shards)]


def _fan_out(x, lo: int, hi: int, shards: int) -> list:
    """``x`` (on its way to the device of shards [lo, hi)) copied there for each of them; the gradient is the
    tree's node over [lo, hi), summed on that device."""
    if hi - lo == 1:
        return [x]

    @tf.custom_gradient
    def fan(x):
        copies = [tf.identity(x) for _ in range(lo, hi)]

        def grad(*dys):
            parts = {k: tf.zeros_like(x) if dy is None else dy for k, dy in zip(range(lo, hi), dys, strict=True)}
            return _node(lambda a, b: parts[a] if b - a == 1 else None, lo, hi, shards)

        return copies, grad

    with on_shard(lo, shards):  # the wrapper and the copies on the block's device: x crosses once
        return list(fan(x))


def run(shard: int, shards: int, fn, inputs: tuple, layers: tuple = ()):
    """``fn(*inputs)`` on shard ``shard``'s device, its backward pass there too.

    A GradientTape builds each gradient op on the device of the scope its ``gradient`` call runs in, not on its
    forward op's: the backward of every shard would run on one device, and, measured here, the weights would
    depend on which devices the forwards had run on. So each shard's part is one op to the outer tape
    (``tf.custom_gradient``) whose gradient ``tf.gradients`` builds beside the forward ops (it colocates them).
    ``layers`` are the Keras layers ``fn`` calls: their weights' current values (a stateless call's) are inputs
    of the part, which is how their gradients leave it. They are read as stored, not cast to a mixed-precision
    compute dtype: the part's layers make that cast inside it, from these values, so the gradient reaches them
    (read cast, the layers would cast again inside from the stored value, and the inputs' gradients were None).
    """
    with AutocastScope(None):  # as stored: under mixed precision the part's layers cast them inside, on its path
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


def tagged(layer, shard: int):
    layer.shard_index = shard
    return layer


def dense_parts(name: str, units: int, shards: int, kernels=None, biases=None, **kwargs) -> list:
    """Part k: a Dense of ``units`` named ``<name>_shard_<k>``. With ``kernels`` (and ``biases``), one array per
    part, its weights start as that array: a layer split from one already built (`models.layout`)."""
    parts = []
    for k in range(shards):
        options = dict(kwargs)
        if kernels is not None:
            options["kernel_initializer"] = _constant(kernels[k])
        if biases is not None:
            options["bias_initializer"] = _constant(biases[k])
        parts.append(tagged(keras.layers.Dense(units, name=f"{name}_shard_{k}", **options), k))
    return parts


def _constant(values):
    return lambda shape, dtype=None: tf.constant(values, dtype=dtype)


class DenseParts:
    """For a layer whose ``parts`` are Dense layers of its whole input: built together, when first called or by
    ``build_like(layer)`` (the Dense layer it splits, whose inputs they take)."""

    def build(self, input_shape):
        for part in self.parts:
            part.build(input_shape)
        self.built = True

    def build_like(self, layer) -> None:
        self.build((None, layer.kernel.shape[0]))


class Column(keras.layers.Layer):
    """A Dense layer of ``units`` outputs kept as ``shards`` column slices (``parts[k]``: outputs
    [k*units/shards, (k+1)*units/shards)); a model calls each part in its shard's `run`. ``kernel`` and ``bias``
    (arrays of the whole layer's shapes): the slices start as theirs; None, each part's own initializers."""

    def __init__(self, units: int, shards: int, activation=None, kernel=None, bias=None, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.shards = shards
        kernels = None if kernel is None else np.split(np.asarray(kernel), shards, axis=1)
        biases = None if bias is None else np.split(np.asarray(bias), shards)
        options = {"activation": activation, "use_bias": use_bias, "dtype": self.dtype_policy}
        self.parts = dense_parts(self.name, units // shards, shards, kernels, biases, **options)
        self.built = True  # never called itself: its parts are, inside their shards' passes


class Row(keras.layers.Layer):
    """A Dense layer of ``units`` outputs kept as ``shards`` row slices: part k multiplies its slice of the
    inputs (in its shard's `run`); ``finish`` adds the partial products along the tree and the bias once, on
    shard 0's device. ``kernel`` and ``bias``: as `Column`'s."""

    def __init__(self, units: int, shards: int, kernel=None, bias=None, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.shards = shards
        kernels = None if kernel is None else np.split(np.asarray(kernel), shards, axis=0)
        self.parts = dense_parts(self.name, units, shards, kernels, use_bias=False, dtype=self.dtype_policy)
        start = "zeros" if bias is None else _constant(bias)
        self.bias = self.add_weight(shape=(units,), initializer=start, name="bias") if use_bias else None
        self.built = True  # never called itself: its parts are, inside their shards' passes

    def finish(self, partials: list):
        with on_shard(0, self.shards):
            total = tree(partials)
            return total if self.bias is None else total + keras.ops.cast(self.bias, total.dtype)


def shard_of_variables(model) -> dict:
    """{id(variable): shard index} of the variables of every shard layer in ``model`` (others are not sharded)."""
    shards = {}
    for layer in model._flatten_layers(include_self=False):
        index = getattr(layer, "shard_index", None)
        if index is not None:
            shards.update({id(v): index for v in layer.variables})
    return shards


def split_layers(model) -> list[tuple[str, str]]:
    """(path, how) of each of ``model``'s layers kept as shards, in model order: how is "column" or "row" for a
    Dense layer split that way, "heads" for an attention layer, else the layer's class (the vocabulary's,
    `models.vocab_shards`)."""
    found = []
    for layer in in_order(model):
        if hasattr(layer, "parts") and isinstance(getattr(layer, "shards", None), int):
            how = getattr(layer, "split_how", None) or (
                "column" if isinstance(layer, Column) else "row" if isinstance(layer, Row) else type(layer).__name__
            )
            found.append(((layer.path or layer.name).removeprefix(f"{model.name}/"), how))
    return found


def in_order(layer) -> list:
    """The layers under ``layer``, each before its own sublayers, siblings in their order (Keras's
    ``_flatten_layers`` visits a layer's children last to first)."""
    found = []
    for child in layer._flatten_layers(include_self=False, recursive=False):
        found.extend([child, *in_order(child)])
    return found


def shard_count(model) -> int:
    """The largest shard count among ``model``'s shard layers (1: none)."""
    counts = [layer.shards for layer in model._flatten_layers(include_self=False) if hasattr(layer, "parts")]
    return max([c for c in counts if isinstance(c, int)] or [1])
