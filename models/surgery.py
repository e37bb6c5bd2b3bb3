"""One layer put in another's place inside a built model, where a plan splits a layer nested in another layer.

A Keras layer keeps its sublayers as attributes and in its tracked list (their order is its variables' order);
`replace` swaps both, so the parent's ``call`` runs the new layer, its weights are the new layer's, in the old
one's place, and a checkpoint reaches the new layer under the attribute's name. `scope` gives the new layer's
variables the old one's folder (``transformer_layer_0/feedforward_output_dense/...``), so names stay unique.
"""

from __future__ import annotations

import contextlib

from keras.src.backend.common.name_scope import name_scope  # keras.name_scope without its override


def replace(parent, old, new) -> None:
    """``new`` where ``old`` was among ``parent``'s tracked layers (in its place) and attributes (a list's too)."""
    parent._tracker.replace_tracked_value("layers", old, new)
    for name, value in list(vars(parent).items()):
        if value is old:
            setattr(parent, name, new)  # tracked already: nothing is added to a built layer
        elif isinstance(value, list):
            value[:] = [new if item is old else item for item in value]


@contextlib.contextmanager
def scope(path: str | None):
    """The Keras name scope of the folder holding ``path`` (absolute: whatever scopes are open): a layer made and
    built inside has the path ``path`` had, and its variables are under it."""
    folders = (path or "").split("/")[:-1]
    if not folders:
        yield
        return
    with name_scope(folders[-1], override_parent="/".join(folders[:-1])):
        yield
