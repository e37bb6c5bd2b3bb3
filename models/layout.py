"""A model's layers split over the devices of a tower by a plan (``--tensor_layout``, or a built-in plan).

A plan is a tuple of (pattern, how). A pattern matches a layer's path as a whole regular expression (the
layout-map convention): ``dense1`` for a layer of the model, ``transformer_layer_0/self_attention`` for a layer
nested in another, ``.*feedforward_output_dense`` for every block's. How a matched layer splits:

- ``column`` / ``row``: a Dense layer by output columns or input rows (`models.split_dense`);
- ``heads``: a ``keras.layers.MultiHeadAttention`` by heads, as one unit (`models.split_attention`).

`split` replaces each matched layer by its split of ``--tensor_shards`` shards, whose shards start as the slices
of that layer's own weights; every other layer is the same object. A layer of a functional or Sequential model's
graph is replaced by rebuilding the graph (``keras.models.clone_model``); a layer nested in another layer (a
Keras Hub ``TransformerDecoder``'s Dense and attention layers, inside a backbone inside the task's model) is
replaced in its parent, in place (`models.surgery`). So the split model computes the function of the model it
was given (a split layer adds its shards' partial products along the shards' fixed tree, not inside one
matmul), is fine-tuned from its weights rather than re-initialised, and, as the built-in Transformer, trains the
same bits at every ``--tensor_parallel`` dividing the shards.

A model that holds layers of a known kind gets a built-in plan when the run splits it and no plan is given
(`plan_for`): Keras Hub's ``TransformerDecoder`` blocks (GPT-2 and its kin): attention by heads, the MLP by
columns then rows; Keras Hub's Llama blocks: the SwiGLU MLP (gate and up by columns, down by rows).
"""

from __future__ import annotations

import functools
import re

import keras
from keras.src.models.functional import Functional  # what keras.models.clone_model rebuilds

from models import sharded, split_attention, split_dense, surgery, vocab_shards
from models.registry import ModelError

SPLITS = {  # how -> (the split of a layer: maker(layer, shards, in_graph), the check refusing what it cannot split)
    "column": (
        lambda layer, shards, in_graph: split_dense.ColumnDense.of(layer, shards),
        functools.partial(split_dense.check, how="column"),
    ),
    "row": (
        lambda layer, shards, in_graph: split_dense.RowDense.of(layer, shards),
        functools.partial(split_dense.check, how="row"),
    ),
    "heads": (lambda layer, shards, in_graph: split_attention.HeadsAttention.of(layer, shards), split_attention.check),
    "vocabulary": (vocab_shards.split_of, vocab_shards.check),
}
HOWS = tuple(SPLITS)

_MLP = ((".*feedforward_intermediate_dense", "column"), (".*feedforward_output_dense", "row"))
BUILT_IN = {
    # (module prefix, class name) of a block a model holds -> the plan that splits it
    ("keras_hub", "TransformerDecoder"): ((".*self_attention", "heads"), *_MLP),
    ("keras_hub", "LlamaTransformerDecoder"): ((".*feedforward_gate_dense", "column"), *_MLP),
}


def plan_for(model: keras.Model, given: tuple, shards: int) -> tuple:
    """The plan to split ``model`` by: ``given`` if any; else, when the run splits (``shards`` > 1) a model
    without layers split in its own code, its own ``tensor_plan`` (the built-in Transformer's) or the built-in
    plan of the blocks it holds (`BUILT_IN`); else none."""
    if given or shards == 1 or sharded.shard_count(model) > 1:
        return tuple(given)
    if getattr(model, "tensor_plan", None):
        return tuple(model.tensor_plan)
    plan = []
    for layer in model._flatten_layers(include_self=False):
        key = (type(layer).__module__.split(".")[0], type(layer).__name__)
        plan.extend(entry for entry in BUILT_IN.get(key, ()) if entry not in plan)
    return tuple(plan)


def split_model(model: keras.Model, given: tuple, shards: int, named: str = "") -> keras.Model:
    """``model`` split into ``shards`` shards by the plan ``given`` (``--tensor_layout``) or, without one, its
    own (`plan_for`); a refusal names where the plan came from."""
    source = "--tensor_layout" if given else f"model {model.name!r}'s built-in tensor plan"
    return split(model, plan_for(model, given, shards), shards, named, source)


def split(
    model: keras.Model, layout: tuple[tuple[str, str], ...], shards: int, named: str = "", source="--tensor_layout"
) -> keras.Model:
    """``model`` with the layers ``layout`` names ((pattern, how), ...) split into ``shards`` shards; ``model``
    itself when ``layout`` is empty or ``shards`` is 1 (the layout is still checked), or when only nested layers
    split (replaced in place). ``named`` says where the count came from in a refusal (the engine's
    "--tensor_parallel (2, ...)"); "--tensor_shards (N)" if empty. ``source``: the plan's, in a refusal.

    Raises:
      ModelError: a pattern matches no layer, a matched layer cannot split that way, two patterns split one
        layer two ways, or ``shards`` does not divide what it cuts.
    """
    if not layout:
        return model
    found = _matched(model, layout, shards, named or f"--tensor_shards ({shards})", source)
    if shards == 1:
        return model
    in_graph = {}
    for layer, how, parent in found:
        if _is_graph(parent):
            in_graph[id(layer)] = how
            continue
        with surgery.scope(layer.path):
            new = SPLITS[how][0](layer, shards, False)
            new.build_like(layer)
        surgery.replace(parent, layer, new)
    if not in_graph:
        return model

    def replace(layer):
        how = in_graph.get(id(layer))
        return layer if how is None else SPLITS[how][0](layer, shards, True)

    return keras.models.clone_model(model, clone_function=replace, recursive=True)


def _is_graph(parent) -> bool:
    return isinstance(parent, (keras.Sequential, Functional))


def _walk(model) -> list[tuple]:
    """(layer, its parent, its path) of every layer under ``model``, each before its sublayers
    (`sharded.in_order`). The path is Keras's, without the model's own name in front (a subclassed or Sequential
    model's layers are made under it): ``dense1``, ``transformer_layer_0/self_attention``."""
    found = []

    def visit(parent):
        for child in parent._flatten_layers(include_self=False, recursive=False):
            path = child.path or child.name
            found.append((child, parent, path.removeprefix(f"{model.name}/")))
            visit(child)

    visit(model)
    return found


def _matched(model, layout, shards: int, named: str, source: str) -> list[tuple]:
    """(layer, how, parent) of every layer a pattern of ``layout`` matches, outermost first (a layer inside a
    matched one is not split again); refuses what cannot be split."""
    layers = _walk(model)
    how_of: dict[int, str] = {}
    found = []
    for pattern, how in layout:
        hits = [entry for entry in layers if re.fullmatch(pattern, entry[2])]
        if not hits:
            raise ModelError(f"{source}: {pattern!r} matches no layer of model {model.name!r} ({_candidates(layers)})")
        for layer, parent, path in hits:
            if how_of.setdefault(id(layer), how) != how:
                raise ModelError(f"{source} splits layer {path!r} both as {how_of[id(layer)]} and as {how}")
            try:
                SPLITS[how][1](layer, path, shards, named)
            except ModelError as refused:
                raise ModelError(f"{source}: {refused}") from None
            found.append((layer, how, parent))
    inner = {id(sub) for layer, _, _ in found for sub in layer._flatten_layers(include_self=False)}
    return [entry for entry in found if id(entry[0]) not in inner]


def _candidates(layers) -> str:
    """The paths of the layers a plan can split (Dense and MultiHeadAttention), or of every layer if none."""
    splittable = [
        path
        for layer, _, path in layers
        if type(layer) is keras.layers.Dense or isinstance(layer, keras.layers.MultiHeadAttention)
    ]
    if splittable:
        return "splittable layers: " + ", ".join(splittable)
    return "layers: " + ", ".join(path for _, _, path in layers)
