"""The tower step computes what a plain single-device training step computes."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import models
from trainer import devices, optim
from trainer.config import OptimizerConfig, TowerConfig
from trainer.sync import SyncUpdate


def _model_and_batch(name, seed=0):
    keras.utils.set_random_seed(seed)
    model = models.build_model(name, (8, 8, 1), 10)
    rng = np.random.default_rng(seed)
    features = rng.random((32, 8, 8, 1)).astype(np.float32)
    labels = rng.integers(0, 10, 32).astype(np.int32)
    return model, features, labels


def _plain_sgd_step(model, features, labels, learning_rate):
    with tf.GradientTape() as tape:
        logits = model(features, training=True)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        loss += tf.add_n(model.losses) if model.losses else 0.0
    grads = tape.gradient(loss, model.trainable_variables)
    for variable, grad in zip(model.trainable_variables, grads, strict=True):
        variable.assign_sub(learning_rate * grad)
    return float(loss)


@pytest.mark.parametrize("name, num_towers, micro_batches", [("mlp", 1, 1), ("mlp", 2, 4), ("resnet20", 2, 2)])
def test_tower_step_equals_plain_step(name, num_towers, micro_batches):
    """Without BatchNorm/Dropout, averaging K micro-batch gradients is the full-batch gradient (the mean of
    equal-sized means), so one step matches a plain step up to float rounding. resnet20's BatchNorm
    normalises per micro-batch, so it is compared only with K=N (and loosely)."""
    model, features, labels = _model_and_batch(name)
    reference, _, _ = _model_and_batch(name)
    placement = devices.resolve(TowerConfig(num_towers=num_towers, device="cpu", parameter_device="cpu"))
    step = tf.Variable(0, dtype=tf.int64)
    optimizer = optim.make_optimizer(OptimizerConfig(name="sgd", learning_rate=0.1, schedule="constant"), 10, step)
    optimizer.build(model.trainable_variables)
    dataset = tf.data.Dataset.from_tensors((features, labels)).repeat()
    update = SyncUpdate(model, optimizer, placement, micro_batches, step, iter(dataset))
    metrics = update.train_steps(1)
    if micro_batches == 1:
        plain_loss = _plain_sgd_step(reference, features, labels, 0.1)
        assert float(metrics["loss"]) == pytest.approx(plain_loss, rel=1e-5)
    else:
        _plain_sgd_step(reference, features, labels, 0.1)
    tolerance = 1e-5 if name == "mlp" else 5e-2
    for ours, theirs in zip(model.trainable_variables, reference.trainable_variables, strict=True):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=tolerance, rtol=tolerance)
    assert int(step.numpy()) == 1
