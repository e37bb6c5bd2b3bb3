"""Functional models nested in a task's model (a Keras Hub backbone is one layer of the task's functional model) are
cut inside (`models.functional_cut`): the backbone's blocks are places, the model inputs later layers read (GPT-2's
padding_mask) cross each cut beside the activation, and the stages run in order compute the model's outputs bit for
bit. The training through such stages: tests/trainer/step/test_pipeline.py. Where a model without nesting is cut:
tests/trainer/step/test_pipeline_cut.py."""

import keras
import numpy as np
import pytest

from models import stages
from models.registry import ModelError

GPT2_PIECES = ["token_embedding", "embeddings_add", "embeddings_dropout", "transformer_layer_0", "transformer_layer_1",
               "layer_norm", "head"]  # fmt: skip
LLAMA_PIECES = ["token_embedding", "transformer_layer_0", "transformer_layer_1", "sequence_output_layernorm", "head"]
IDS = np.random.default_rng(0).integers(1, 64, size=(2, 8))
MASK = np.array([[1] * 8, [1] * 5 + [0] * 3])


def _hub_model(backbone: str) -> keras.Model:
    pytest.importorskip("keras_hub")
    from benchmarks.harness import hub_tasks

    keras.utils.set_random_seed(1)
    build = hub_tasks.gpt2_backbone if backbone == "gpt2" else hub_tasks.llama_backbone
    return hub_tasks.task_model(build(), name=f"hub_{backbone}")


def _through(cut: list, inputs, training=False) -> list:
    """What each stage gives, run in order on `inputs`."""
    given = []
    for stage in cut:
        inputs = stage.call(inputs, training=training)
        given.append(inputs)
    return given


@pytest.mark.quick
@pytest.mark.parametrize("backbone, names", [("gpt2", GPT2_PIECES), ("llama", LLAMA_PIECES)])
def test_a_hub_backbone_is_cut_between_its_blocks_and_the_stages_give_the_models_bits(backbone, names):
    model = _hub_model(backbone)
    assert [p.name for p in stages.pieces(model)] == names
    inputs = {"token_ids": IDS.astype("int64"), "padding_mask": MASK.astype("int64")}  # as a batch gives them
    whole = model(inputs, training=False).numpy()
    cut = stages.cut(model, 2)
    assert len(cut) == 2
    first, last = _through(cut, inputs)
    # What crosses: the activation, and the padding mask (an input every later block reads), as the model's int32.
    x, (mask,) = first
    assert (x.dtype, tuple(x.shape), mask.dtype) == ("float32", (2, 8, 32), "int32")
    assert np.array_equal(mask.numpy(), MASK)
    assert np.array_equal(last.numpy(), whole)
    # Named places: each block ends a stage; past the last block only the activation crosses.
    named = stages.cut(model, 3, after=("transformer_layer_0", "transformer_layer_1"))
    given = _through(named, inputs)
    assert isinstance(given[0], tuple) and not isinstance(given[1], tuple)
    assert np.array_equal(given[-1].numpy(), whole)
    owner = stages.stage_of_variables(model, named)
    assert sorted(set(owner.values())) == [0, 1, 2] and len(owner) == len(model.variables)


@pytest.mark.quick
def test_a_tied_head_is_refused_as_tied_weights():
    """A head that reads the backbone's embedding (`token_embedding(x, reverse=True)`, GPT2CausalLM's) shares its
    variable with the first piece: no stage can own it."""
    pytest.importorskip("keras_hub")
    from benchmarks.harness import hub_tasks

    backbone = hub_tasks.gpt2_backbone()
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in ("token_ids", "padding_mask")}
    logits = backbone.token_embedding(backbone(inputs), reverse=True)
    with pytest.raises(ModelError, match=r"variable token_embedding/embeddings is used by pipeline stages 0 and 1: a"):
        stages.cut(keras.Model(inputs, logits, name="tied"), 2)


def _inner() -> keras.Model:
    """(x, y) -> x * y -> two blocks -> a norm: its places are `masked` (then y is read no more) and the blocks."""
    x, y = keras.Input((4,), name="x"), keras.Input((4,), name="y")
    h = keras.layers.Multiply(name="masked")([x, y])
    for i in range(2):
        h = keras.layers.Dense(4, name=f"block_{i}")(h)
    return keras.Model([x, y], keras.layers.LayerNormalization(name="norm")(h), name="inner")


@pytest.mark.quick
def test_the_layers_feeding_a_nested_model_run_in_its_first_piece():
    """The nested model is fed two activations (`embed`'s and `gate`'s): `gate` runs in its first piece, which ends
    where it reads the second one no more; a name two pieces would share is prefixed with the nested model's."""
    x = keras.Input((4,), name="x")
    fed = [keras.layers.Dense(4, name="embed")(x), keras.layers.Dense(4, name="gate")(x)]
    model = keras.Model(x, keras.layers.Dense(4, name="head")(_inner()(fed)), name="fed")
    found = stages.pieces(model)
    assert [p.name for p in found] == ["embed", "masked", "block_0", "block_1", "norm", "head"]
    assert [layer.name for layer in found[1].layers] == ["gate", "masked"]
    values = np.arange(8.0).reshape(2, 4)
    given = _through(stages.cut(model, 3, after=("masked", "block_1")), values)
    assert np.array_equal(given[-1].numpy(), model(values).numpy())
    # The norm inside and a Dense outside share a name: the inner one is qualified.
    shared = keras.Model(x, keras.layers.Dense(4, name="norm")(_inner()(fed)), name="shared")
    assert [p.name for p in stages.pieces(shared)] == ["embed", "masked", "block_0", "block_1", "inner/norm", "norm"]


@pytest.mark.quick
def test_a_nested_model_a_tensor_passes_around_stays_whole():
    """A residual around the nested model (its input added to its output): cutting inside would carry that
    activation past the blocks, so the nested model is one piece, as a residual block is."""
    x = keras.Input((4,), name="x")
    embedded = keras.layers.Dense(4, name="embed")(x)
    out = keras.layers.Add(name="residual")([embedded, _inner()([embedded, x])])
    model = keras.Model(x, out, name="around")
    assert [[layer.name for layer in p.layers] for p in stages.pieces(model)] == [["embed"], ["inner", "residual"]]


@pytest.mark.quick
def test_a_sequential_model_nested_in_a_sequential_model_is_cut_inside():
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="i1"), keras.layers.Dense(4, name="i2")])
    model = keras.Sequential([keras.Input((4,)), inner, keras.layers.Dense(2, name="o")], name="outer")
    assert [p.name for p in stages.pieces(model)] == ["i1", "i2", "o"]
    values = np.arange(8.0).reshape(2, 4)
    assert np.array_equal(_through(stages.cut(model, 3), values)[-1].numpy(), model(values).numpy())
