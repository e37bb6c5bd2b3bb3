"""An attention layer split by heads (`models.layout`'s "heads"), as one unit.

Shard k of N is an attention layer over heads [k*H/N, (k+1)*H/N): its query, key and value projections'
columns for them (an ``EinsumDense`` kernel [width, heads, head size] or a Dense kernel [width, heads x head
size] cut along its heads), and the output projection's rows for them, without its bias. Each shard projects,
attends and multiplies by its rows on its own device; the N partial outputs are added along the shards' fixed
tree (`models.sharded`), then the output bias once, on shard 0's device. So attention splits with one sum per
call, as in Megatron, and its result is the same bits at every ``--tensor_parallel`` dividing N.

Two kinds split: ``keras.layers.MultiHeadAttention`` (Keras Hub's ``CachedMultiHeadAttention`` too), each shard
a copy of its class with H/N heads; and a layer that splits itself, with ``heads_shard(N, k)`` (a built layer of
the same sublayer names over its heads, without output bias or output dropout), ``output_projection`` and
``output_dropout`` (the built-in Transformer's `CausalSelfAttention`). Every shard's weights start as the given
layer's slices, each cut along the one axis its heads make.

The first input is copied to each shard's device (its gradient the tree's sum); a second or third floating
input that is another tensor (cross-attention's value and key) too; anything else (a mask) is shared. A Keras
mask carried by the inputs reaches every shard. Incremental decoding's cache is cut by heads the same way and
put back together in head order.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops
from keras.src import backend

from models import sharded, surgery
from models.registry import ModelError
from models.split_dense import refuse_extras


def check(layer, path: str, shards: int, named: str) -> None:
    """Refuses a layer that is neither kind, or whose heads ``shards`` does not divide."""
    if not (isinstance(layer, keras.layers.MultiHeadAttention) or hasattr(layer, "heads_shard")):
        raise ModelError(
            f"layer {path!r} is a {type(layer).__name__}; heads splits a MultiHeadAttention "
            "(a Dense layer splits by column or row)"
        )
    refuse_extras(layer, path)
    heads = layer.num_heads if isinstance(layer, keras.layers.MultiHeadAttention) else layer.heads
    if heads % shards:
        raise ModelError(
            f"{named} must divide the heads ({heads}) of layer {path!r}: each shard holds whole "
            f"heads; use a shard count that divides {heads}"
        )


class HeadsAttention(keras.layers.Layer):
    """An attention layer kept as ``shards`` attention layers of heads/shards heads each; see the module
    docstring. Build it with ``HeadsAttention.of(layer, shards)``: its shards start as ``layer``'s slices."""

    split_how = "heads"

    @classmethod
    def of(cls, layer, shards: int) -> HeadsAttention:
        split = cls(layer, shards, name=layer.name, dtype=layer.dtype_policy)
        split._path = layer.path  # built here, not by a call: the path its variables are under
        return split

    def __init__(self, layer, shards: int, **kwargs):
        super().__init__(**kwargs)
        self.shards = shards
        own = hasattr(layer, "heads_shard")
        self.heads = layer.heads if own else layer.num_heads
        self.head_size = layer.head_size if own else layer.key_dim
        make = layer.heads_shard if own else lambda n, k: _keras_shard(layer, n, k)
        with surgery.scope(f"{layer.path}/part"):  # the parts' variables under the attention's path
            self.parts = [sharded.tagged(make(shards, k), k) for k in range(shards)]
        for k, part in enumerate(self.parts):
            _copy_slices(part, layer, shards, k)
        bias = (layer.output_projection if own else layer._output_dense).bias
        values = None if bias is None else bias.numpy()
        start = None if bias is None else (lambda shape, dtype=None: ops.convert_to_tensor(values, dtype=dtype))
        self.bias = None if bias is None else self.add_weight(shape=values.shape, initializer=start, name="bias")
        self.output_dropout = layer.output_dropout if own else None  # the whole layer's, after the sum
        self.built = True  # its parts are built, from the given layer's weights

    def build_like(self, layer) -> None:
        """Nothing to build: the parts are built when made."""

    def call(self, *args, training=None, cache=None, **kwargs):
        args = (*args, *(kwargs.pop(name) for name in _INPUTS[len(args) :] if name in kwargs))  # Keras Hub names them
        if cache is not None:
            return self._cached(*args, cache=cache, training=training, **kwargs)
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dtype != "bool":  # read by every shard: a quarter of int32's bytes, same values
            kwargs["attention_mask"] = ops.cast(mask, "bool")
        copied = [0] + [i for i in (1, 2) if i < len(args) and _copied(args[i], args[0])]
        masks = [backend.get_keras_mask(args[i]) for i in copied]
        copies = [sharded.to_shards(args[i], self.shards) if self.shards > 1 else [args[i]] for i in copied]
        outputs = [
            sharded.run(
                k,
                self.shards,
                self._pass(k, args, copied, masks, training, kwargs),
                tuple(c[k] for c in copies),
                (part,),
            )
            for k, part in enumerate(self.parts)
        ]
        if kwargs.get("return_attention_scores"):
            scores = ops.concatenate([scored for _, scored in outputs], axis=1)
            return self._finish([out for out, _ in outputs], training), scores
        return self._finish(outputs, training)

    def _pass(self, k: int, args: tuple, copied: list, masks: list, training, kwargs: dict):
        def shard_pass(*xs):
            given = list(args)
            for i, x, mask in zip(copied, xs, masks, strict=True):
                if mask is not None:
                    backend.set_keras_mask(x, mask)
                given = [x if a is args[i] else a for a in given]  # self-attention: query is value
            return self.parts[k](*given, training=training, **kwargs)

        return shard_pass

    def _finish(self, partials: list, training=None):
        with sharded.on_shard(0, self.shards):
            total = sharded.tree(partials)
            total = total if self.bias is None else total + ops.cast(self.bias, total.dtype)
            return total if self.output_dropout is None else self.output_dropout(total, training=training)

    def _cached(self, query, value, key=None, cache=None, **kwargs):
        """Keras Hub's incremental decoding: each shard with its heads' slice of the cache
        [B, 2, length, heads, head size], where the caller is."""
        caches = ops.split(cache, self.shards, axis=3)
        results = [part(query, value, key=key, cache=c, **kwargs) for part, c in zip(self.parts, caches, strict=True)]
        output = self._finish([result[0] for result in results])
        kept = ops.concatenate([result[-1] for result in results], axis=3)
        if len(results[0]) == 3:  # (output, attention scores, cache)
            return output, ops.concatenate([result[1] for result in results], axis=1), kept
        return output, kept

    def cached_call(self, x, mask, positions, cache):
        """The built-in Transformer's incremental decoding (`CausalSelfAttention.cached_call`): each shard with
        its heads of the (keys, values) cache [B, heads, context, head size]."""
        pairs = zip(*(ops.split(half, self.shards, axis=1) for half in cache), strict=True)
        results = [part.cached_call(x, mask, positions, pair) for part, pair in zip(self.parts, pairs, strict=True)]
        kept = tuple(ops.concatenate([r[1][i] for r in results], axis=1) for i in (0, 1))
        return self._finish([r[0] for r in results]), kept


_INPUTS = ("query", "value", "key")  # a MultiHeadAttention's inputs, in its call's order


def _copied(x, first) -> bool:
    """A positional input each shard gets a copy of: a floating tensor other than the first input."""
    return x is not None and x is not first and hasattr(x, "dtype") and "float" in str(x.dtype)


def _keras_shard(layer, shards: int, k: int):
    """Shard k of a MultiHeadAttention: its class with heads/shards heads, built for ``layer``'s inputs, its
    output projection without a bias (the split layer adds it once)."""
    config = layer.get_config()
    config.update(num_heads=layer.num_heads // shards, name=f"{layer.name}_shard_{k}")
    part = type(layer).from_config(config)
    query_shape, value_shape, key_shape = (_input_shape(dense) for dense in _projections(layer))
    part.build(query_shape, value_shape, key_shape)
    _drop_output_bias(part, query_shape)
    return part


def _copy_slices(part, whole, shards: int, k: int) -> None:
    """Each trainable weight of ``part`` set to its namesake's in ``whole`` (the same path below the layer), cut
    to shard k's slice."""
    source = {w.path.removeprefix(f"{whole.path}/"): w for w in whole.trainable_weights}
    for variable in part.trainable_weights:
        values = source[variable.path.removeprefix(f"{part.path}/")].numpy()
        variable.assign(_slice(values, variable.shape, shards, k))


def _projections(layer) -> tuple:
    return layer._query_dense, layer._value_dense, layer._key_dense


def _input_shape(dense) -> tuple:
    """The input shape of an EinsumDense projection: its equation's input rank, the last axis its kernel's first."""
    rank = len(dense.equation.split(",")[0])
    return (None,) * (rank - 1) + (dense.kernel.shape[0],)


def _drop_output_bias(part, query_shape) -> None:
    old = part._output_dense
    if old.bias is None:
        return
    new = keras.layers.EinsumDense(
        old.equation, output_shape=old.partial_output_shape, bias_axes=None, name=old.name, dtype=old.dtype_policy
    )
    shape = list(part._query_dense.compute_output_shape(query_shape))
    shape[-1] = part._value_dim
    with surgery.scope(old.path):
        new.build(tuple(shape))
    surgery.replace(part, old, new)


def _slice(values: np.ndarray, shape, shards: int, k: int) -> np.ndarray:
    """``values`` cut to ``shape``: its k-th of ``shards`` equal slices along the one axis where they differ."""
    axes = [i for i, (a, b) in enumerate(zip(values.shape, shape, strict=True)) if a != b]
    if not axes:
        return values
    (axis,) = axes
    return np.split(values, shards, axis=axis)[k]
