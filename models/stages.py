"""A model cut into pipeline stages: consecutive parts, each run on its own device (`--pipeline_stages`).

A model is first a sequence of *pieces*, the places it may be cut between:

- a model with a ``pipeline_pieces()`` method gives its own (``models.transformer.TransformerLM``: the
  embedding, each block, the final norm and head); its ``call`` runs the same pieces, so a cut computes
  exactly the ops of the whole model;
- a Keras functional model is cut where its graph narrows to one tensor and the model's inputs: a layer output
  every path from the inputs to the outputs goes through, besides paths from an input. A skip connection is
  never cut: the layers it spans stay in one piece (a ResNet is cut between its residual blocks, never inside
  one). The tensor crosses the cut, with the model inputs later layers read (``(tensor, (inputs...))``). A
  nested functional model (a Keras Hub backbone, one layer of the task's model) is cut inside at its own
  places (its blocks); ``models.functional_cut`` says exactly what crosses;
- any other model cannot be cut, and ``pieces`` says so.

``cut`` then groups the pieces into S contiguous stages: after the pieces the user names (``--pipeline_cuts``),
or balanced by parameter bytes (the largest stage as small as it can be; the activations a stage keeps are not
counted). Bytes depend only on the variables' shapes, so every process and every rerun cuts the same way. Each
variable belongs to the one stage whose pieces use it; a variable two stages share (tied weights) is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras
import numpy as np

from models import functional_cut
from models.registry import ModelError


@dataclasses.dataclass(frozen=True)
class Piece:
    """One uncuttable part of a model: ``call(inputs, training) -> outputs`` over the variables of ``layers``.
    The outputs of a piece are the inputs of the next (any nest of tensors)."""

    name: str
    call: Callable
    layers: tuple


@dataclasses.dataclass(frozen=True)
class Stage:
    """Consecutive pieces run as one part on one device."""

    index: int
    pieces: tuple[Piece, ...]

    def call(self, inputs, training: bool):
        for piece in self.pieces:
            inputs = piece.call(inputs, training)
        return inputs

    @property
    def layers(self) -> list:
        return [layer for piece in self.pieces for layer in piece.layers]

    @property
    def name(self) -> str:
        first, last = self.pieces[0].name, self.pieces[-1].name
        return first if first == last else f"{first}..{last}"


def pieces(model: keras.Model) -> list[Piece]:
    """The pieces of `model`, in order (see the module docstring).

    Raises:
      ModelError: the model is neither functional nor gives ``pipeline_pieces()``.
    """
    own = getattr(model, "pipeline_pieces", None)
    if own is not None:
        return list(own())
    if not functional_cut.is_functional(model):
        raise ModelError(
            f"model {model.name!r} cannot be cut into pipeline stages: it is not a Keras functional model and "
            "has no pipeline_pieces() method (docs/pipelines.md says how to give one)"
        )
    return [Piece(*found) for found in functional_cut.functional_pieces(model)]


def cut(model: keras.Model, num_stages: int, after: tuple[str, ...] = ()) -> list[Stage]:
    """`model`'s pieces in `num_stages` contiguous stages: ending after the pieces named in `after` (S-1 names,
    in order), or, without names, the largest stage's parameter bytes as small as possible (ties: the earlier
    cut).

    Raises:
      ModelError: fewer pieces than stages, a name that is not a piece (or out of order), or a variable used by
        two stages.
    """
    found = pieces(model)
    if len(found) < num_stages:
        raise ModelError(
            f"model {model.name!r} has {len(found)} place(s) to cut between ({_names(found)}) "
            f"and --pipeline_stages={num_stages} needs {num_stages}; use fewer stages"
        )
    if after:
        bounds = [0, *_named_bounds(model, found, after), len(found)]
    else:
        sizes = [sum(_bytes(v) for layer in p.layers for v in layer.trainable_variables) for p in found]
        bounds = _balanced(sizes, num_stages)
    stages = [Stage(s, tuple(found[bounds[s] : bounds[s + 1]])) for s in range(num_stages)]
    stage_of_variables(model, stages)  # refuses shared variables now, not at the first step
    return stages


def _named_bounds(model: keras.Model, found: list[Piece], after: tuple[str, ...]) -> list[int]:
    """The stage boundaries after the pieces named `after`: each a piece but the last, in increasing order."""
    places = [p.name for p in found[:-1]]
    bounds = []
    for name in after:
        if name not in places:
            raise ModelError(
                f"--pipeline_cuts: {name!r} is not a place model {model.name!r} can be cut after; the places, in "
                f"order: {', '.join(places)}"
            )
        bounds.append(places.index(name) + 1)
    if bounds != sorted(set(bounds)):
        raise ModelError(f"--pipeline_cuts ({','.join(after)}) must name places in the model's order, each once")
    return bounds


def _names(found: list[Piece]) -> str:
    return ", ".join(p.name for p in found)


def stage_of_variables(model: keras.Model, stages: list[Stage]) -> dict[int, int]:
    """{id of a model variable: the stage using it}; every variable of `model` must be used by one stage.

    Raises:
      ModelError: a variable used by two stages, or by none.
    """
    owner = {}
    for stage in stages:
        for layer in stage.layers:
            for variable in layer.variables:
                if owner.setdefault(id(variable), stage.index) != stage.index:
                    raise ModelError(
                        f"variable {variable.path} is used by pipeline stages {owner[id(variable)]} and "
                        f"{stage.index}: a variable must belong to one stage (tied weights cannot be cut apart)"
                    )
    unused = [v.path for v in model.variables if id(v) not in owner]
    if unused:
        raise ModelError(f"variables {unused} belong to no pipeline stage: no piece's layers hold them")
    return owner


def variable_stages(model: keras.Model, num_stages: int, after: tuple[str, ...] = ()) -> list[int]:
    """The stage of each of `model.variables` when cut into `num_stages` (`cut`)."""
    owner = stage_of_variables(model, cut(model, num_stages, after))
    return [owner[id(v)] for v in model.variables]


def _bytes(variable) -> int:
    return int(np.prod(variable.shape, dtype=np.int64)) * np.dtype(variable.dtype).itemsize


def _balanced(sizes: list[int], parts: int) -> list[int]:
    """Boundaries b_0=0 < b_1 < ... < b_parts=len(sizes) minimising the largest part's sum (linear partition,
    by dynamic programming; on a tie the earliest boundary)."""
    n = len(sizes)
    prefix = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    # best[k][i]: the smallest largest-part of sizes[:i] in k parts; choice[k][i]: where the last part starts.
    best = [[None] * (n + 1) for _ in range(parts + 1)]
    choice = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for start in range(k - 1, i):
                if best[k - 1][start] is None:
                    continue
                cost = max(best[k - 1][start], int(prefix[i] - prefix[start]))
                if best[k][i] is None or cost < best[k][i]:
                    best[k][i], choice[k][i] = cost, start
    bounds, i = [n], n
    for k in range(parts, 0, -1):
        i = choice[k][i]
        bounds.append(i)
    return bounds[::-1]
