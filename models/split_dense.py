"""A Dense layer split by columns or rows, built from a layer that exists (`models.layout`'s "column" and "row").

- ``column``: shard k keeps output columns [k*U/N, (k+1)*U/N) (Megatron's column-parallel layer);
- ``row``: shard k keeps input rows, and the N partial products are added (row-parallel).

Each starts as the slices of the given layer's own weights, so the split layer computes that layer's function.
Called on its own, a column layer copies its input to each shard's device and gathers the shards' outputs on
shard 0's; a row layer cuts its input into the shards' slices there and adds the partial products along the
shards' fixed tree. A row layer whose input is a column layer's output directly (Dense -> Dense, as in a
Transformer's MLP) takes the column shards' outputs where they are, Megatron's pairing: the gather is left
unused (`sharded.parts_of`). A layer between them (a Dropout, a LayerNorm, a SwiGLU's product), or a pipeline
stage's cut, needs the whole tensor and gets it: the same bits, more traffic.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from models import sharded
from models.registry import ModelError

EXTRAS = ("kernel_regularizer", "bias_regularizer", "activity_regularizer", "kernel_constraint", "bias_constraint")


def check(layer, path: str, shards: int, named: str, how: str) -> None:
    """Refuses a layer that is not a plain Dense layer, or whose split dimension ``shards`` does not divide."""
    if type(layer) is not keras.layers.Dense:
        raise ModelError(
            f"layer {path!r} is a {type(layer).__name__}; {how} splits a "
            "Dense layer (a MultiHeadAttention splits by heads; a layer of another kind splits in the model's own "
            "code, with models.sharded)"
        )
    refuse_extras(layer, path)
    size, what = (layer.units, "units") if how == "column" else (layer.kernel.shape[0], "inputs")
    if size % shards:
        raise ModelError(
            f"{named} must divide the {what} ({size}) of layer {path!r}, "
            f"split by {how}: each shard holds an equal slice; use a shard count that divides {size}"
        )


def refuse_extras(layer, path: str) -> None:
    """Refuses regularizers, constraints, LoRA and quantization, which a split layer does not keep."""
    kept = [name for name in EXTRAS if getattr(layer, name, None) or getattr(layer, f"_{name}", None)]
    if kept or getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        what = ", ".join(kept) or "LoRA or quantization"
        raise ModelError(f"layer {path!r} has {what}, which a split layer does not keep")


def _weights(layer) -> dict:
    bias = layer.bias.numpy() if layer.use_bias else None
    return {"kernel": layer.kernel.numpy(), "bias": bias, "use_bias": layer.use_bias, "dtype": layer.dtype_policy}


class ColumnDense(sharded.DenseParts, sharded.Column):
    """A Dense layer split by columns, called on its own: the input copied to each shard (its gradient the tree
    sum of theirs), each shard's outputs on its device, gathered on shard 0's."""

    split_how = "column"

    @classmethod
    def of(cls, layer, shards: int) -> ColumnDense:
        return cls(layer.units, shards, layer.activation, name=layer.name, **_weights(layer))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.built = False  # built (its parts) when first called, or by `build_like`

    def call(self, x):
        copies = sharded.to_shards(x, self.shards)
        outputs = [sharded.run(k, self.shards, part, (copies[k],), (part,)) for k, part in enumerate(self.parts)]
        return sharded.gather(outputs, self.shards)


class RowDense(sharded.Row):
    """A Dense layer split by rows, called on its own: each shard multiplies its slice of the input on its
    device, the partial products added along the tree, then the bias and the activation."""

    split_how = "row"

    @classmethod
    def of(cls, layer, shards: int) -> RowDense:
        return cls(layer.units, shards, activation=layer.activation, name=layer.name, **_weights(layer))

    def __init__(self, *args, activation=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.activation = keras.activations.get(activation)
        self.built = False  # built (its parts) when first called, or by `build_like`

    def build(self, input_shape):
        for part in self.parts:
            part.build((*input_shape[:-1], input_shape[-1] // self.shards))
        self.built = True

    def build_like(self, layer) -> None:
        self.build((None, layer.kernel.shape[0]))

    def call(self, x):
        slices = sharded.parts_of(x, self.shards) or tf.split(x, self.shards, axis=-1)
        partials = [sharded.run(k, self.shards, part, (slices[k],), (part,)) for k, part in enumerate(self.parts)]
        return self.activation(self.finish(partials))
