"""A user's model split over the devices of a tower by a layout map (``--tensor_layout``).

A functional or Sequential Keras model names its layers. ``--tensor_layout=PATTERN=HOW,...`` says which Dense
layers to split and how; a pattern matches a layer's whole name as a regular expression (as the keys of
Keras's ``LayoutMap`` match variable paths):

- ``column``: shard k keeps output columns [k*U/N, (k+1)*U/N) (Megatron's column-parallel layer);
- ``row``: shard k keeps input rows, and the N partial products are added (row-parallel).

`split` rebuilds the model with each such layer replaced by a `ColumnDense` or `RowDense` of ``--tensor_shards``
shards, whose shards start as the slices of that layer's own weights; every other layer is the same object,
shared. So the split model computes the function of the model it was given (a row layer adds its partial
products along the shards' fixed tree, not inside one matmul) and, as the built-in Transformer, trains the
same bits at every ``--tensor_parallel`` dividing the shards.

Called on its own, a column layer copies its input to each shard's device and gathers the shards' outputs on
shard 0's; a row layer cuts its input into the shards' slices there and adds the partial products. A row layer
whose input is a column layer's output directly (Dense -> Dense, as in a Transformer's MLP) takes the column
shards' outputs where they are, Megatron's pairing: the gather is left unused (`sharded.parts_of`). A layer
between them (a Dropout, a LayerNorm), or a pipeline stage's cut, needs the whole tensor and gets it: the same
bits, more traffic.
"""

from __future__ import annotations

import re

import keras
import tensorflow as tf
from keras.src.models.functional import Functional  # what keras.models.clone_model rebuilds

from models import sharded
from models.registry import ModelError


def split(model: keras.Model, layout: tuple[tuple[str, str], ...], shards: int, named: str = "") -> keras.Model:
    """``model`` with the Dense layers ``layout`` names ((pattern, "column" or "row"), ...) split into ``shards``
    shards; ``model`` itself when ``layout`` is empty or ``shards`` is 1 (the layout is still checked). ``named``
    says where the count came from in a refusal (the engine's "--tensor_parallel (2, ...)"); "--tensor_shards
    (N)" if empty.

    Raises:
      ModelError: the model is not functional or Sequential, a pattern matches no layer, a matched layer is not
        a plain Dense layer, two patterns split one layer two ways, or ``shards`` does not divide what it cuts.
    """
    if not layout:
        return model
    how_of = _matched(model, layout, shards, named or f"--tensor_shards ({shards})")
    if shards == 1:
        return model

    def replace(layer):
        how = how_of.get(id(layer))
        return layer if how is None else _SPLITS[how](layer, shards)

    return keras.models.clone_model(model, clone_function=replace, recursive=True)


def _matched(model, layout, shards: int, named: str) -> dict[int, str]:
    """{id(layer): how} of every layer a pattern of ``layout`` matches; refuses what cannot be split."""
    if not isinstance(model, (keras.Sequential, Functional)):
        raise ModelError(
            f"--tensor_layout splits the layers of a functional or Sequential model; model {model.name!r} is a "
            f"{type(model).__name__} (a subclassed model): build its wide layers from models.sharded, as the "
            "built-in language model does (models/transformer.py)"
        )
    layers = list(model._flatten_layers(include_self=False))
    how_of: dict[int, str] = {}
    for pattern, how in layout:
        found = [layer for layer in layers if re.fullmatch(pattern, layer.name)]
        if not found:
            names = ", ".join(layer.name for layer in layers)
            raise ModelError(f"--tensor_layout: {pattern!r} matches no layer of model {model.name!r} ({names})")
        for layer in found:
            _check_layer(layer, how, shards, named)
            if how_of.setdefault(id(layer), how) != how:
                raise ModelError(f"--tensor_layout splits layer {layer.name!r} both by column and by row")
    return how_of


def _check_layer(layer, how: str, shards: int, named: str) -> None:
    if type(layer) is not keras.layers.Dense:
        raise ModelError(
            f"--tensor_layout: layer {layer.name!r} is a {type(layer).__name__}; only Dense layers split "
            "(a layer of another kind splits in the model's own code, with models.sharded)"
        )
    extras = ("kernel_regularizer", "bias_regularizer", "activity_regularizer", "kernel_constraint", "bias_constraint")
    kept = [name for name in extras if getattr(layer, name, None) is not None]
    if kept or getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        what = ", ".join(kept) or "LoRA or quantization"
        raise ModelError(f"--tensor_layout: layer {layer.name!r} has {what}, which a split layer does not keep")
    size, what = (layer.units, "units") if how == "column" else (layer.kernel.shape[0], "inputs")
    if size % shards:
        raise ModelError(
            f"--tensor_layout: {named} must divide the {what} ({size}) of layer {layer.name!r}, "
            f"split by {how}: each shard holds an equal slice; use a shard count that divides {size}"
        )


def _weights(layer) -> dict:
    bias = layer.bias.numpy() if layer.use_bias else None
    return {"kernel": layer.kernel.numpy(), "bias": bias, "use_bias": layer.use_bias, "dtype": layer.dtype_policy}


class ColumnDense(sharded.Column):
    """A Dense layer split by columns, called on its own: the input copied to each shard (its gradient the tree
    sum of theirs), each shard's outputs on its device, gathered on shard 0's."""

    @classmethod
    def of(cls, layer, shards: int) -> ColumnDense:
        return cls(layer.units, shards, layer.activation, name=layer.name, **_weights(layer))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.built = False  # built (its parts) when first called

    def build(self, input_shape):
        for part in self.parts:
            part.build(input_shape)
        self.built = True

    def call(self, x):
        copies = sharded.to_shards(x, self.shards)
        outputs = [sharded.run(k, self.shards, part, (copies[k],), (part,)) for k, part in enumerate(self.parts)]
        return sharded.gather(outputs, self.shards)


class RowDense(sharded.Row):
    """A Dense layer split by rows, called on its own: each shard multiplies its slice of the input on its
    device, the partial products added along the tree, then the bias and the activation."""

    @classmethod
    def of(cls, layer, shards: int) -> RowDense:
        return cls(layer.units, shards, activation=layer.activation, name=layer.name, **_weights(layer))

    def __init__(self, *args, activation=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.activation = keras.activations.get(activation)
        self.built = False  # built (its parts) when first called

    def build(self, input_shape):
        for part in self.parts:
            part.build((*input_shape[:-1], input_shape[-1] // self.shards))
        self.built = True

    def call(self, x):
        slices = sharded.parts_of(x, self.shards) or tf.split(x, self.shards, axis=-1)
        partials = [sharded.run(k, self.shards, part, (slices[k],), (part,)) for k, part in enumerate(self.parts)]
        return self.activation(self.finish(partials))


_SPLITS = {"column": ColumnDense.of, "row": RowDense.of}
