"""A ``keras.layers.MultiHeadAttention`` split by heads (`models.layout`'s "heads"), as one unit.

Shard k of N is a copy of the attention layer (its own class, Keras Hub's ``CachedMultiHeadAttention`` too) with
heads [k*H/N, (k+1)*H/N): its query, key and value projections' columns for them (an ``EinsumDense`` kernel
[width, heads, head size] cut along its heads axis, as Megatron cuts a column layer), and the output projection's
rows for them ([heads, head size, width], without its bias). Each shard projects, attends and multiplies by its
rows on its own device; the N partial outputs are added along the shards' fixed tree (`models.sharded`) and the
output bias is added once, on shard 0's device. So attention splits with one sum per call, as in Megatron, and
its result is the same bits at every ``--tensor_parallel`` dividing N.

A mask carried by the query or value tensors (Keras's implicit masks) is handed to every shard; an
``attention_mask`` argument is shared by all. Incremental decoding's ``cache`` [B, 2, length, heads, head size]
is cut by heads the same way and put back together in head order.
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
    """Refuses a layer that is not a MultiHeadAttention, or whose heads ``shards`` does not divide."""
    if not isinstance(layer, keras.layers.MultiHeadAttention):
        raise ModelError(
            f"--tensor_layout: layer {path!r} is a {type(layer).__name__}; heads splits a "
            "MultiHeadAttention (a Dense layer splits by column or row)"
        )
    refuse_extras(layer, path)
    if layer.num_heads % shards:
        raise ModelError(
            f"--tensor_layout: {named} must divide the heads ({layer.num_heads}) of layer "
            f"{path!r}: each shard holds whole heads; use a shard count that divides "
            f"{layer.num_heads}"
        )


class HeadsAttention(keras.layers.Layer):
    """A MultiHeadAttention kept as ``shards`` attention layers of heads/shards heads each; see the module
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
        with surgery.scope(f"{layer.path}/part"):  # the parts' variables under the attention's path
            self.parts = [sharded.tagged(_shard_of(layer, shards, k), k) for k in range(shards)]
        whole = layer._output_dense
        bias = whole.bias.numpy() if whole.bias is not None else None
        start = None if bias is None else (lambda shape, dtype=None: ops.convert_to_tensor(bias, dtype=dtype))
        self.bias = None if bias is None else self.add_weight(shape=bias.shape, initializer=start, name="bias")
        self.built = True  # its parts are built, from the given layer's weights

    def build_like(self, layer) -> None:
        """Nothing to build: the parts are built when made."""

    def call(self, query, value, key=None, training=None, cache=None, **kwargs):
        if cache is not None:
            return self._cached(query, value, key, cache, training=training, **kwargs)
        inputs = [query] if value is query and key in (None, query) else [query, value, value if key is None else key]
        masks = [backend.get_keras_mask(x) for x in inputs]
        copies = [sharded.to_shards(x, self.shards) if self.shards > 1 else [x] for x in inputs]
        outputs = [
            sharded.run(k, self.shards, self._pass(k, masks, training, kwargs), tuple(c[k] for c in copies), (part,))
            for k, part in enumerate(self.parts)
        ]
        if kwargs.get("return_attention_scores"):
            scores = ops.concatenate([scored for _, scored in outputs], axis=1)
            return self._finish([out for out, _ in outputs]), scores
        return self._finish(outputs)

    def _pass(self, k: int, masks: list, training, kwargs: dict):
        def shard_pass(*xs):
            for x, mask in zip(xs, masks, strict=True):
                if mask is not None:
                    backend.set_keras_mask(x, mask)
            query, value, key = (xs[0], xs[0], None) if len(xs) == 1 else xs
            return self.parts[k](query, value, key=key, training=training, **kwargs)

        return shard_pass

    def _finish(self, partials: list):
        with sharded.on_shard(0, self.shards):
            total = sharded.tree(partials)
            return total if self.bias is None else total + ops.cast(self.bias, total.dtype)

    def _cached(self, query, value, key, cache, **kwargs):
        """Incremental decoding: each shard with its heads' slice of the cache, where the caller is."""
        caches = ops.split(cache, self.shards, axis=3)
        results = [part(query, value, key=key, cache=c, **kwargs) for part, c in zip(self.parts, caches, strict=True)]
        output = self._finish([result[0] for result in results])
        kept = ops.concatenate([result[-1] for result in results], axis=3)
        if len(results[0]) == 3:  # (output, attention scores, cache)
            return output, ops.concatenate([result[1] for result in results], axis=1), kept
        return output, kept


def _shard_of(layer, shards: int, k: int):
    """Shard k: ``layer``'s class with heads/shards heads, built for ``layer``'s inputs, its weights ``layer``'s
    slices for heads [k*H/N, (k+1)*H/N) (each weight cut along the one axis whose size the heads make), its output
    projection without a bias (the split layer adds it once)."""
    config = layer.get_config()
    config.update(num_heads=layer.num_heads // shards, name=f"{layer.name}_shard_{k}")
    part = type(layer).from_config(config)
    query_shape, value_shape, key_shape = (_input_shape(dense) for dense in _projections(layer))
    part.build(query_shape, value_shape, key_shape)
    _drop_output_bias(part, query_shape)
    for mine, whole in zip(_sublayers(part), _sublayers(layer), strict=True):
        for variable, source in zip(mine.weights, whole.weights, strict=False):
            variable.assign(_slice(source.numpy(), variable.shape, shards, k))
    return part


def _projections(layer) -> tuple:
    return layer._query_dense, layer._value_dense, layer._key_dense


def _sublayers(layer) -> list:
    names = ("_query_dense", "_key_dense", "_value_dense", "_gate_dense", "_output_dense")
    return [getattr(layer, name) for name in names if getattr(layer, name, None) is not None]


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
