"""The pieces of a Keras functional model (`models.stages`), cut inside the functional models nested in it.

A *place* to cut is a layer output where the model's graph narrows to that one tensor and the model's inputs:
every path from the inputs to the outputs that does not start at an input goes through it, and no layer runs on
both sides of it. What crosses the cut is that tensor alone when no later layer reads a model input, else the
nest ``(tensor, (inputs...))``: the model's inputs later layers read (as the model standardises them: its
``keras.Input`` dtypes), in the order of ``model.inputs``. No other activation crosses: the layers a skip
connection spans stay in one piece (a ResNet is cut between its residual blocks). No variable computes an input,
so carrying one adds no gradient to a sum: the pieces run exactly the model's ops, each once.

A piece that ends with a nested functional model (a Keras Hub backbone: one layer of the task's model) is cut
inside it too: the nested model's own places are places, and those of its inputs the model's inputs feed count
as model inputs (GPT-2's ``padding_mask``, read by every block, crosses each cut between blocks); the piece's
layers that feed the nested model run in its first part. A nested model a skip passes (a later layer reads its
output and an earlier activation) stays one piece, as a residual block does. A piece is named by the last layer
it runs (``transformer_layer_3``); a name two pieces would share is prefixed with the nested models' names
(``gpt2_backbone/layer_norm``).
"""

from __future__ import annotations

import dataclasses

import keras


@dataclasses.dataclass(frozen=True)
class _Step:
    """A sub-model of one (nested) model: what flows in (and the model inputs `reads`, by index) -> what flows on."""

    sub: keras.Model
    reads: tuple[int, ...] = ()

    def __call__(self, value, carried: dict, training):
        if self.reads:
            value = [value, *[carried[i] for i in self.reads]]
        return self.sub.call(value, training=training), carried


@dataclasses.dataclass(frozen=True)
class _Start:
    """The whole model's inputs standardised as the model does (its Input dtypes), kept to carry by index."""

    sub: keras.Model

    def __call__(self, value, carried: dict, training):
        value = self.sub.call(value, training=training)
        return value, dict(enumerate(keras.tree.flatten(value)))


class _Feed:
    """A nested model's argument, the nest `fed`, from what flows in (the tensors `start`), the carried model
    inputs and, for the tensors layers compute, the outputs of their sub-model of `model`."""

    def __init__(self, model, free: dict, start, fed):
        where = {id(t): ("flows", i) for i, t in enumerate(keras.tree.flatten(start))}
        where.update({k: ("carried", i) for k, i in free.items() if k not in where})
        computed = [t for t in keras.tree.flatten(fed) if id(t) not in where]
        self.pre = _step(model, free, start, computed, "feed") if computed else None
        where.update({id(t): ("computed", i) for i, t in enumerate(computed)})
        self.fed, self.where = fed, [where[id(t)] for t in keras.tree.flatten(fed)]
        self.layers = _own_layers(self.pre.sub) if self.pre else []
        self.reads = {i for kind, i in self.where if kind == "carried"} | set(self.pre.reads if self.pre else ())

    def __call__(self, value, carried: dict, training):
        computed = keras.tree.flatten(self.pre(value, carried, training)[0]) if self.pre else []
        given = {"flows": keras.tree.flatten(value), "carried": carried, "computed": computed}
        return keras.tree.pack_sequence_as(self.fed, [given[kind][i] for kind, i in self.where]), carried


@dataclasses.dataclass
class _Part:
    steps: list
    layers: list
    name: str
    path: str = ""  # the nested models' names down to the level of `name` ("gpt2_backbone/"), "" at the top

    @property
    def reads(self) -> set:
        return {i for step in self.steps for i in getattr(step, "reads", ())}


def functional_pieces(model: keras.Model) -> list[tuple]:
    """(name, call(inputs, training), layers) of each piece of the functional `model`, in order."""
    everything = {id(t): i for i, t in enumerate(model.inputs)}
    parts = _level_parts(model, everything, "")
    start = _input(model)
    parts[0].steps.insert(0, _Start(keras.Model(start, start, name=f"{model.name}_inputs")))
    carried = [sorted(set().union(*[p.reads for p in parts[i + 1 :]])) for i in range(len(parts))]
    names = _unique_names(parts)
    return [
        (names[i], _call(part.steps, carried[i - 1] if i else (), carried[i]), tuple(part.layers))
        for i, part in enumerate(parts)
    ]


def _unique_names(parts: list[_Part]) -> list[str]:
    """Each part's last layer's name; where two parts share one, prefixed with the nested models' names (then,
    should they still share it, suffixed with the part's index)."""
    names = [p.name for p in parts]
    names = [p.path + p.name if names.count(p.name) > 1 else p.name for p in parts]
    return [f"{name}_{i}" if names.count(name) > 1 else name for i, name in enumerate(names)]


def _call(steps: list, reads_in: list, reads_out: list):
    def call(inputs, training):
        value, carried = (inputs[0], dict(zip(reads_in, inputs[1], strict=True))) if reads_in else (inputs, {})
        for step in steps:
            value, carried = step(value, carried, training)
        return (value, tuple(carried[i] for i in reads_out)) if reads_out else value

    return call


def _level_parts(model: keras.Model, free: dict, path: str) -> list[_Part]:
    """The parts of `model` (the top one or a nested one), whose inputs in `free` (id -> index among the top
    model's inputs) may cross its cuts."""
    bounds = [_input(model), *_places(model, free), _single(model.outputs)]
    parts = []
    for i in range(len(bounds) - 1):
        parts += _segment(model, free, bounds[i], bounds[i + 1], path, f"{model.name}_piece_{i}")
    return parts


def _places(model: keras.Model, free: dict) -> list:
    """The layer outputs where `model`'s graph narrows to one tensor and the inputs in `free`, in order."""
    layers = _own_layers(model)
    everything, ends = {id(layer) for layer in layers}, keras.tree.flatten(model.outputs)
    last, covered, places = {id(t) for t in model.inputs}, set(), []
    calls, _ = _walk(ends, set())
    for layer in layers[:-1]:
        outputs = [t for i in calls.get(id(layer), []) for t in layer._inbound_nodes[i].output_tensors]
        if len(outputs) != 1:
            continue  # several outputs (or calls): not one tensor
        output = outputs[0]  # in this model's graph (a nested model's `output` is in its own)
        before, before_leaves = _walk([output], last | free.keys())
        after, after_leaves = _walk(ends, {id(output)} | free.keys())
        if (
            before_leaves <= last | free.keys()
            and after_leaves <= {id(output)} | free.keys()
            and not before.keys() & after.keys()
            and not covered & (before.keys() | after.keys())
            and covered | before.keys() | after.keys() == everything
        ):
            places.append(output)
            covered |= before.keys()
            last = {id(output)}
    return places


def _segment(model, free: dict, start, end, path: str, name: str) -> list[_Part]:
    """The part of `model` from `start` to `end`, or the parts of the one nested functional model in it."""
    step = _step(model, free, start, end, name)
    nested = [layer for layer in _own_layers(step.sub) if is_functional(layer)]
    if len(nested) == 1:
        parts = _descend(model, free, start, end, nested[0], path)
        if parts:
            return parts
    own = _own_layers(step.sub)
    return [_Part([step], own, own[-1].name if own else step.sub.name, path)]


def _descend(model, free: dict, start, end, nested: keras.Model, path: str) -> list[_Part] | None:
    """The parts of `nested`, which ends the piece from `start` to `end` (its output is `end`), the layers that
    feed it run in its first part; None when it has no place inside, or takes more than one argument."""
    if not isinstance(end, keras.KerasTensor) or end._keras_history.operation is not nested:
        return None  # something reads the nested model's output and another tensor: a skip passes it
    node = nested._inbound_nodes[end._keras_history.node_index]
    args, kwargs = node.arguments.args, node.arguments.kwargs
    fed = keras.tree.flatten(args)
    if len(args) != 1 or len(fed) != len(nested.inputs) or _tensors(kwargs):
        return None
    inner = {id(t): free[id(x)] for t, x in zip(nested.inputs, fed, strict=True) if id(x) in free}
    parts = _level_parts(nested, inner, f"{path}{nested.name}/")
    if len(parts) == 1:
        return None  # no place inside: the piece is the nested model, as it was
    feed = _Feed(model, free, start, args[0])
    parts[0].steps.insert(0, feed)
    parts[0].layers[:0] = feed.layers
    return parts


def _step(model, free: dict, start, end, name: str) -> _Step:
    """The sub-model of `model` from `start` (and the inputs in `free` it reads past it) to `end`."""
    starts = {id(t) for t in keras.tree.flatten(start)}
    _, leaves = _walk(keras.tree.flatten(end), starts | free.keys())
    reads = sorted(free[i] for i in leaves - starts if i in free)
    by_index = {free[id(t)]: t for t in model.inputs if id(t) in free}
    inputs = [_single(start), *[by_index[i] for i in reads]] if reads else _single(start)
    return _Step(keras.Model(inputs, _single(end), name=f"{model.name}_{name}"), tuple(reads))


def _walk(ends: list, stops: set) -> tuple[dict, set]:
    """({id of each layer computing `ends` from the tensors whose ids are in `stops`: its node indices}, the ids
    of the tensors the walk stopped at: those in `stops` and the model inputs it reached)."""
    calls, leaves, seen, todo = {}, set(), set(), list(ends)
    while todo:
        tensor = todo.pop()
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        operation, node_index, _ = tensor._keras_history
        if id(tensor) in stops or isinstance(operation, keras.layers.InputLayer):
            leaves.add(id(tensor))
            continue
        calls.setdefault(id(operation), []).append(node_index)
        todo += operation._inbound_nodes[node_index].input_tensors
    return {k: sorted(set(v)) for k, v in calls.items()}, leaves


def _tensors(nest) -> list:
    return [x for x in keras.tree.flatten(nest) if isinstance(x, keras.KerasTensor)]


def is_functional(model) -> bool:
    """A Keras functional (or Sequential) model: one whose inputs and outputs are symbolic tensors."""
    try:
        ends = keras.tree.flatten(model.inputs) + keras.tree.flatten(model.outputs)
    except (AttributeError, ValueError):
        return False
    return bool(ends) and all(isinstance(x, keras.KerasTensor) for x in ends)


def _own_layers(model: keras.Model) -> list:
    return [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]


def _input(model: keras.Model):
    """`model`'s inputs, the nest it was built on (a Sequential model: its one input)."""
    return _single(model.inputs if isinstance(model, keras.Sequential) else model.input)


def _single(tensors):
    return tensors[0] if isinstance(tensors, list) and len(tensors) == 1 else tensors
