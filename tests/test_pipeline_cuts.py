"""Cuts named by the user (`--pipeline_cuts`): the stages end after the named pieces, and every name that is not
a place to cut is refused in one line with the places. The weights do not depend on where a model is cut: the
run through named cuts is in tests/test_pipeline.py beside the balanced ones."""

import pytest

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
    from trainer.settings import validate

    towers = cfg.TowerConfig(num_towers=4, device="cpu", pipeline_stages=2, pipeline_cuts=("a", "b"))
    with pytest.raises(cfg.ConfigError, match=r"--pipeline_cuts names 2 place\(s\) and --pipeline_stages=2 needs 1"):
        validate.validate(cfg.RunConfig(towers=towers))
    one_stage = cfg.TowerConfig(num_towers=4, device="cpu", pipeline_cuts=("a",))
    with pytest.raises(cfg.ConfigError, match=r"--pipeline_cuts names 1 place\(s\) and --pipeline_stages=1 needs 0"):
        validate.validate(cfg.RunConfig(towers=one_stage))
    plan = cfg.TowerConfig(num_towers=4, pipeline_stages=2, pipeline_cuts=("a",)).pipeline
    assert plan == cfg.Pipeline(stages=2, schedule="1f1b", cuts=("a",))
