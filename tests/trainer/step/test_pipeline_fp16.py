"""fp16 through pipeline stages: the loss scale carried as a tower carries it, so the weights are those of one
stage (`trainer.step.pipeline.runner`, docs/pipelines.md)."""

import numpy as np
import pytest

from tests.trainer.step.test_pipeline import _config


@pytest.mark.quick
def test_an_earlier_stages_regularisation_gets_the_gradient_the_whole_models_tape_gives_it():
    """What `stage_events.reg_gradient` hands a stage's regularisation sum is d(total)/d(reg) of a tower's total
    (`towers.run_micro_batch`): weight, or with fp16's scale per_weight(loss + weight * reg, weight) * scale."""
    import tensorflow as tf

    from trainer.step.core import micro_batch as mb
    from trainer.step.pipeline import stage_events

    rng = np.random.default_rng(5)
    for weight, scale in [(0.0, 32768.0), (3.0, 32768.0), (17.0, 1.0)] + [
        tuple(rng.uniform(1, 900, 2)) for _ in range(50)
    ]:
        loss, reg = tf.constant(2.5), tf.constant(0.125)
        weight, scale = tf.constant(weight, tf.float32), tf.constant(scale, tf.float32)
        for with_scale in (None, scale):
            with tf.GradientTape() as tape:
                tape.watch(reg)
                total = loss + weight * reg
                total = total if with_scale is None else mb.per_weight(total, weight) * with_scale
            flow = stage_events.Flow(None, 0, [], [], [], {}, {}, with_scale, weight=weight)
            assert stage_events.reg_gradient(flow).numpy() == tape.gradient(total, reg).numpy()


def test_fp16s_loss_scale_goes_through_the_stages_with_the_bits_of_one_stage(tmp_path):
    """The cnn in float16 with dynamic loss scaling, 2 stages against 1: the last stage differentiates the scaled
    mean and every gradient is multiplied by the micro-batch's weight after, as a tower does. (resnet20, L2 on
    every stage, was measured the same way by hand: docs/pipelines.md.)"""
    import dataclasses

    from trainer.loop.run import train

    results = []
    for num_stages in (1, 2):
        config = _config(tmp_path / f"s{num_stages}", 2, num_stages)
        towers = dataclasses.replace(config.towers, mixed_precision="fp16")
        loop = dataclasses.replace(config.loop, train_steps=3, log_every_steps=3)
        results.append(train(dataclasses.replace(config, towers=towers, loop=loop)))
    one, two = results
    assert two["pipeline"]["stages"] == 2 and "pipeline" not in one
    assert (two["weights_sha256"], two["train_loss"]) == (one["weights_sha256"], one["train_loss"])
    assert two["eval_loss"] == one["eval_loss"]  # eval through the stages, too
