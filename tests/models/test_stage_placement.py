"""Where a pipeline's parts go: the cuts a user names (`--pipeline_cuts`: the stages end after the named pieces,
every name that is not a place to cut refused in one line with the places), and eval through the stages, each
on its device. The weights do not depend on where a model is cut: the language model's run through named cuts
is in tests/tasks/test_lm_training.py beside the balanced ones."""

import numpy as np
import pytest
import tensorflow as tf

from models import stages
from models.registry import ModelError
from trainer.settings import config as cfg


def _cnn():
    from models.cnn import cnn

    return cnn((8, 8, 1), 10)


@pytest.mark.quick
def test_the_stages_end_after_the_named_layers_and_own_their_variables():
    model = _cnn()
    cut = stages.cut(model, 3, after=("relu1", "flatten"))
    assert [s.name for s in cut] == ["conv1..relu1", "conv2..flatten", "dense1..logits"]
    owner = stages.stage_of_variables(model, cut)
    stage_of = {v.path: owner[id(v)] for v in model.variables}
    assert (stage_of["conv1/kernel"], stage_of["bn1/moving_mean"], stage_of["conv2/kernel"]) == (0, 0, 1)
    assert (stage_of["dense1/kernel"], stage_of["logits/bias"]) == (2, 2)
    # Without names the same model is cut by bytes elsewhere: the names, not the bytes, decided.
    assert [s.name for s in stages.cut(model, 3)] != [s.name for s in cut]
    assert stages.variable_stages(model, 3, ("relu1", "flatten")) == [stage_of[v.path] for v in model.variables]


@pytest.mark.quick
def test_the_language_model_is_cut_after_its_own_pieces():
    from models.transformer import transformer_lm

    model = transformer_lm(vocab_size=32, layers=3, heads=2, width=16, context=8, positions="learned", dropout=0.0)
    cut = stages.cut(model, 2, after=("embedding",))
    assert [s.name for s in cut] == ["embedding", "block_0..head"]
    assert [s.name for s in stages.cut(model, 3, after=("block_0", "block_2"))] == [
        "embedding..block_0", "block_1..block_2", "head"
    ]  # fmt: skip


@pytest.mark.quick
@pytest.mark.parametrize(
    "after, message",
    [
        (("conv3",), r"'conv3' is not a place model 'cnn' can be cut after; the places, in order: conv1, bn1, relu1,"),
        (("logits",), r"'logits' is not a place .* dropout2$"),  # the last piece ends the model, not a stage
        (("flatten", "relu1"), r"must name places in the model's order, each once"),
        (("relu1", "relu1"), r"must name places in the model's order, each once"),
    ],
)
def test_a_name_that_is_not_a_place_to_cut_is_refused_with_the_places(after, message):
    with pytest.raises(ModelError, match=message):
        stages.cut(_cnn(), len(after) + 1, after=after)


@pytest.mark.quick
def test_a_layer_inside_a_residual_block_is_not_a_place():
    from models.resnet20 import resnet20

    model = resnet20((32, 32, 3), 10)
    inside = next(layer.name for layer in model.layers if "block" in layer.name and "conv" in layer.name)
    with pytest.raises(ModelError, match=f"'{inside}' is not a place"):
        stages.cut(model, 2, after=(inside,))


@pytest.mark.quick
def test_the_number_of_names_must_be_one_less_than_the_stages():
    from trainer.step import modes

    towers = cfg.TowerConfig(num_towers=4, device="cpu", pipeline_stages=2, pipeline_cuts=("a", "b"))
    with pytest.raises(cfg.ConfigError, match=r"--pipeline_cuts names 2 place\(s\) and --pipeline_stages=2 needs 1"):
        modes.settle(cfg.RunConfig(towers=towers))
    one_stage = cfg.TowerConfig(num_towers=4, device="cpu", pipeline_cuts=("a",))
    with pytest.raises(cfg.ConfigError, match=r"--pipeline_cuts names 1 place\(s\) and --pipeline_stages=1 needs 0"):
        modes.settle(cfg.RunConfig(towers=one_stage))
    plan = cfg.TowerConfig(num_towers=4, pipeline_stages=2, pipeline_cuts=("a",)).pipeline
    assert plan == cfg.Pipeline(stages=2, schedule="1f1b", cuts=("a",))


@pytest.mark.quick
def test_eval_runs_each_stage_of_a_parts_pipeline_on_its_device_with_the_whole_models_outputs():
    from trainer.step.sync import runners

    model = _cnn()
    from trainer.system.devices import Placement

    towers = tuple(f"/device:CPU:{i}" for i in range(4))
    forward = runners.inference(model, Placement(towers, towers[0]), cfg.Pipeline(stages=2))
    parts = tf.random.stateless_uniform((4, 2, 8, 8, 1), seed=(1, 2))

    @tf.function
    def every_part(x):
        return [forward(i, x[i]) for i in range(4)]

    # parts 0, 1 through pipeline 0 (CPU:0, CPU:1), parts 2, 3 through pipeline 1 (CPU:2, CPU:3)
    devices = {}
    for op in every_part.get_concrete_function(parts).graph.get_operations():
        layer = op.name.split("/")[0].rsplit("_", 1)[0]  # "logits_3/MatMul": the 4th call's logits
        if layer in ("conv1", "logits") and op.type in ("Conv2D", "MatMul"):
            devices.setdefault(layer, []).append(tf.DeviceSpec.from_string(op.device).device_index)
    assert devices == {"conv1": [0, 0, 2, 2], "logits": [1, 1, 3, 3]}
    for i, outputs in enumerate(every_part(parts)):
        assert np.array_equal(outputs.numpy(), model(parts[i], training=False).numpy())
    whole = runners.inference(model, Placement(towers, towers[0]), cfg.Pipeline())
    assert np.array_equal(whole(3, parts[3]).numpy(), model(parts[3], training=False).numpy())
