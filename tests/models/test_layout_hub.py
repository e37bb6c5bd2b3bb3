"""Keras Hub backbones (built by Keras Hub's own code from small configs, random weights) split by a plan.

A model holding GPT-2's ``TransformerDecoder`` blocks gets the built-in plan (attention by heads, the MLP by
columns then rows), its layers replaced inside the blocks, inside the backbone, inside the task's model; the
split model computes the given model's function from its weights, and under `sharded.placed` its gradients are
the same bits on 1, 2 and 4 devices. Llama's blocks split their SwiGLU MLP. The engine's run of the GPT-2 task
at T = 1, 2 is tests/trainer/step/test_tensor_plans.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.harness import hub_tasks
from models import ModelError, layout, sharded
from trainer.system import determinism

pytest.importorskip("keras_hub")

GPT2_PLAN = (
    (".*self_attention", "heads"),
    (".*feedforward_intermediate_dense", "column"),
    (".*feedforward_output_dense", "row"),
)


def _model(backbone):
    keras.utils.set_random_seed(1)
    return hub_tasks.task_model(backbone(), "causal_lm", tied=True)


def _inputs():
    ids = np.random.RandomState(0).randint(0, hub_tasks.VOCAB, (3, 8)).astype("int32")
    return {"token_ids": ids, "padding_mask": np.ones_like(ids)}


def _gradients(model, devices: int) -> list:
    names = [d.name for d in tf.config.list_logical_devices("CPU")][:devices]

    @tf.function
    def step(x):
        with sharded.placed(names), tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        return loss, tape.gradient(loss, model.trainable_variables)

    loss, grads = step(_inputs())
    return [loss.numpy(), *(g.numpy() for g in grads)]


def test_gpt2_splits_by_its_built_in_plan_with_the_bits_of_one_device_at_every_t():
    determinism.configure(0, True)
    model = _model(hub_tasks.gpt2_backbone)
    before = model(_inputs()).numpy()
    plan = layout.plan_for(model, (), 4)
    assert plan == GPT2_PLAN and layout.plan_for(model, (), 1) == () and layout.plan_for(model, GPT2_PLAN[:1], 4)
    assert layout.split(model, plan, 4) is model  # every split layer is nested: replaced in place
    assert sharded.split_layers(model)[:3] == [
        ("transformer_layer_0/self_attention", "heads"),
        ("transformer_layer_0/feedforward_intermediate_dense", "column"),
        ("transformer_layer_0/feedforward_output_dense", "row"),
    ]
    paths = [v.path for v in model.variables]
    assert len(paths) == len(set(paths)) and "transformer_layer_0/self_attention/bias" in paths
    assert "transformer_layer_1/self_attention/self_attention_shard_3/query/kernel" in paths
    np.testing.assert_allclose(model(_inputs()).numpy(), before, rtol=1e-5, atol=1e-5)
    one, *others = [_gradients(model, t) for t in (1, 2, 4)]
    for values in others:
        assert all(np.array_equal(a, b) for a, b in zip(one, values, strict=True))


@pytest.mark.quick
def test_llama_splits_its_mlp_and_a_plan_names_nested_layers_or_is_refused():
    model = _model(hub_tasks.llama_backbone)
    before = model(_inputs()).numpy()
    assert layout.plan_for(model, (), 2) == ((".*feedforward_gate_dense", "column"), *GPT2_PLAN[1:])
    layout.split(model, layout.plan_for(model, (), 2), 2)
    assert [how for _, how in sharded.split_layers(model)] == ["column", "column", "row"] * 2
    np.testing.assert_allclose(model(_inputs()).numpy(), before, rtol=1e-5, atol=1e-5)
    gpt2 = _model(hub_tasks.gpt2_backbone)
    refusals = {
        (("transformer_layer_0/self_attention", "heads"),): (
            "--tensor_shards (3) must divide the heads (4) of layer 'transformer_layer_0/self_attention'"
        ),
        ((".*attention_output", "row"),): "layer 'transformer_layer_0/self_attention/attention_output' is a "
        "EinsumDense; row splits a Dense layer",
        (("block_.*", "column"),): "'block_.*' matches no layer of model 'causal_lm' (splittable layers: "
        "transformer_layer_0/self_attention, transformer_layer_0/feedforward_intermediate_dense, ",
    }
    for entries, message in refusals.items():
        with pytest.raises(ModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
            layout.split(gpt2, entries, 3)
