"""`models.layout`: a functional model's Dense layers split by name (`--tensor_layout`).

The split model computes the function of the model it was given, from the same weights; under `sharded.placed`
its forward and gradients are the same bits on 1, 2 and 4 devices of a tower; a row layer right after a column
layer takes the column shards' outputs as they are (no slicing of the gathered tensor in the graph); and what
cannot be split is refused with a `ModelError` naming the layer. The engine's run of it (the command line at T =
1, 2, 4, and its export) is in tests/trainer/step/test_tensor_parallel.py and test_served_equals_evaluated.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from models import ModelError, layout, sharded
from models.mlp import mlp
from trainer.system import determinism

pytestmark = pytest.mark.quick
SPLIT = (("dense1", "column"), ("dense2", "row"))


def _mlp(between: bool = False):
    """The built-in mlp; ``between``: a functional model with a layer between its column and row layers."""
    keras.utils.set_random_seed(0)
    if not between:
        return mlp((8, 8, 1), 10)
    inputs = keras.Input((64,))
    x = keras.layers.Dense(32, activation="relu", name="up")(inputs)
    x = keras.layers.Activation("tanh", name="between")(x)
    return keras.Model(inputs, keras.layers.Dense(10, name="down")(x))


def _images(seed=0):
    return np.random.RandomState(seed).randn(16, 8, 8, 1).astype("float32")


def test_the_split_model_computes_the_given_one_from_its_weights():
    model = _mlp()
    split = layout.split(model, SPLIT, 4)
    np.testing.assert_allclose(split(_images()), model(_images()), rtol=1e-5, atol=1e-6)
    assert [v.path for v in split.get_layer("dense1").variables][:2] == [
        "dense1/dense1_shard_0/kernel",
        "dense1/dense1_shard_0/bias",
    ]
    np.testing.assert_array_equal(split.get_layer("dense2").parts[1].kernel, model.get_layer("dense2").kernel[64:128])
    assert split.get_layer("logits") is model.get_layer("logits")  # every other layer shared, not copied
    assert sharded.shard_count(split) == 4 and layout.split(model, SPLIT, 1) is model


def _placed_pass(model, inputs, devices: int):
    """(outputs, gradients of the sum of squares) traced under `placed` on the first ``devices`` devices, and
    the graph's op types."""
    names = [d.name for d in tf.config.list_logical_devices("CPU")][:devices]

    @tf.function
    def step(x):
        with sharded.placed(names), tf.GradientTape() as tape:
            y = model(x)
            loss = tf.reduce_sum(y * y)
        return y, tape.gradient(loss, model.trainable_variables)

    outputs, grads = step(inputs)
    ops = [op.type for op in step.get_concrete_function(inputs).graph.get_operations()]
    return [outputs.numpy(), *(g.numpy() for g in grads)], ops


@pytest.mark.parametrize("between", [False, True], ids=["column then row", "a layer between"])
def test_one_two_and_four_devices_give_the_same_bits(between):
    determinism.configure(0, True)
    split = layout.split(_mlp(between), (("dense1|up", "column"), ("dense2|down", "row")), 4)
    inputs = _images().reshape(16, 64) if between else _images()
    (one, ops), *others = [_placed_pass(split, inputs, t) for t in (1, 2, 4)]
    for values, _ in others:
        assert all(np.array_equal(a, b) for a, b in zip(one, values, strict=True))
    # Column -> row: the row takes the column shards' outputs; with a layer between, it slices the whole tensor.
    assert ops.count("Split") == (1 if between else 0)


def test_what_cannot_be_split_is_refused_naming_the_layer():
    model = _mlp()
    refusals = {
        (("dense9", "row"),): "'dense9' matches no layer of model 'mlp' (splittable layers: dense1, dense2, logits)",
        (("flatten", "row"),): "layer 'flatten' is a Flatten; row splits a Dense layer",
        (("dense1", "heads"),): "layer 'dense1' is a Dense; heads splits a MultiHeadAttention",
        (("logits", "column"),): "--tensor_shards (4) must divide the units (10) of layer 'logits', split by column",
        (("dense.*", "column"), ("dense2", "row")): "splits layer 'dense2' both as column and as row",
    }
    for entries, message in refusals.items():
        with pytest.raises(ModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
            layout.split(model, entries, 4)
    regularized = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, kernel_regularizer="l2", name="wide")])
    with pytest.raises(ModelError, match="layer 'wide' has kernel_regularizer"):
        layout.split(regularized, (("wide", "column"),), 2)


class _Subclassed(keras.Model):
    """A subclassed model: its layers are attributes, called in its own code."""

    def __init__(self):
        super().__init__(name="subclassed")
        self.up = keras.layers.Dense(32, activation="relu", name="up")
        self.down = keras.layers.Dense(10, name="down")

    def call(self, x):
        return self.down(self.up(x))


def test_a_subclassed_models_layers_are_split_in_place():
    """No graph to rebuild: each named layer is replaced in its parent, in its place (`models.surgery`)."""
    keras.utils.set_random_seed(0)
    model = _Subclassed()
    inputs = _images().reshape(16, 64)
    before = model(inputs).numpy()
    names = [v.path for v in model.variables]
    split = layout.split(model, (("up", "column"), ("down", "row")), 4)
    assert split is model and sharded.split_layers(model) == [("up", "column"), ("down", "row")]
    assert [type(layer).__name__ for layer in model.layers] == ["ColumnDense", "RowDense"]
    assert [v.path for v in model.variables][:2] == ["subclassed/up/up_shard_0/kernel", "subclassed/up/up_shard_0/bias"]
    assert len(model.variables) == 4 * 2 + 4 + 1 and len(names) == 4  # the old layers' variables gone
    np.testing.assert_allclose(model(inputs).numpy(), before, rtol=1e-5, atol=1e-6)
