"""The tower step computes what a plain single-device training step computes."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import models
from tasks.classify import Classify
from trainer.loop.inputs import PlacedIterator
from trainer.settings.config import OptimizerConfig, RunConfig, TowerConfig
from trainer.step.sync.sync_update import SyncUpdate
from trainer.step.update import optimizers
from trainer.system import determinism, devices

CLASSIFY = Classify(RunConfig())  # (features, labels) batches, cross-entropy


def _model_and_batch(name, seed=0):
    keras.utils.set_random_seed(seed)
    model = models.build_model(name, (8, 8, 1), 10)
    rng = np.random.default_rng(seed)
    features = rng.random((32, 8, 8, 1)).astype(np.float32)
    labels = rng.integers(0, 10, 32).astype(np.int32)
    return model, features, labels


def _plain_sgd_step(model, features, labels, learning_rate, micro_batches=1):
    """A plain SGD step whose gradient is the mean of the gradients of `micro_batches` equal slices (each a
    forward pass of its own, so BatchNorm normalises per slice, as towers do). Returns the mean loss."""
    losses, grads = [], []
    for x, y in zip(np.split(features, micro_batches), np.split(labels, micro_batches), strict=True):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
            total = loss + tf.add_n(model.losses) if model.losses else loss
        losses.append(float(loss))  # the reported loss is the cross-entropy, as the towers report it
        grads.append(tape.gradient(total, model.trainable_variables))
    for i, variable in enumerate(model.trainable_variables):
        variable.assign_sub(learning_rate * tf.add_n([g[i] for g in grads]) / micro_batches)
    return float(np.mean(losses))


def _streams(features, labels, k: int) -> list[PlacedIterator]:
    """K input streams on the host, stream j yielding the j-th slice of the batch forever."""
    size = len(labels) // k
    parts = [(features[j * size : (j + 1) * size], labels[j * size : (j + 1) * size]) for j in range(k)]
    return [PlacedIterator(tf.data.Dataset.from_tensors(p).repeat(), devices.HOST_DEVICE) for p in parts]


@pytest.mark.parametrize(
    "name, num_towers, micro_batches", [("mlp", 1, 1), ("mlp", 2, 4), ("resnet20", 1, 1), ("resnet20", 2, 2)]
)
def test_tower_step_equals_plain_step(name, num_towers, micro_batches):
    """One tower step equals a plain SGD step on the same K slices (for the mlp, without BatchNorm, that is
    the full-batch gradient), up to float rounding."""
    model, features, labels = _model_and_batch(name)
    reference, _, _ = _model_and_batch(name)
    placement = devices.place(TowerConfig(num_towers=num_towers, device="cpu", parameter_device="cpu"))
    step = tf.Variable(0, dtype=tf.int64)
    optimizer = optimizers.make_optimizer(OptimizerConfig(name="sgd", learning_rate=0.1, schedule="constant"), 10, step)
    optimizer.build(model.trainable_variables)
    update = SyncUpdate(
        CLASSIFY, model, optimizer, placement, micro_batches, step, _streams(features, labels, micro_batches)
    )
    before = [v.numpy() for v in model.trainable_variables]
    result = update.train_steps(1)
    plain_loss = _plain_sgd_step(reference, features, labels, 0.1, micro_batches)
    assert result.loss == pytest.approx(plain_loss, rel=1e-5)
    for ours, theirs, old in zip(model.trainable_variables, reference.trainable_variables, before, strict=True):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-5, rtol=1e-5)
        assert not np.array_equal(ours.numpy(), old)  # the step moved every variable
    assert int(step.numpy()) == 1


def test_state_no_micro_batch_changes_stays_bitwise_for_k_not_a_power_of_two():
    """A frozen BatchNorm's moving statistics: averaging K equal copies, (K * x) / K, drifts by an ulp for K=3
    on most values (with Grappler's arithmetic optimizer off, as --deterministic runs); the combine keeps them
    as they were."""
    determinism.configure(1, True)
    inputs = keras.Input((8, 8, 1))
    frozen = keras.layers.BatchNormalization(name="frozen")
    x = frozen(keras.layers.Conv2D(4, 3, name="conv")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(keras.layers.Flatten()(x)))
    frozen.trainable = False
    rng = np.random.default_rng(0)
    frozen.moving_mean.assign(rng.random(4).astype(np.float32) + 0.1)
    frozen.moving_variance.assign(rng.random(4).astype(np.float32) + 0.7)
    stats = [frozen.moving_mean.numpy(), frozen.moving_variance.numpy()]
    assert any((np.float32(3) * s) / np.float32(3) != s for s in np.concatenate(stats))  # would drift
    placement = devices.place(TowerConfig(num_towers=1, device="cpu", parameter_device="cpu"))
    step = tf.Variable(0, dtype=tf.int64)
    optimizer = optimizers.make_optimizer(OptimizerConfig(name="sgd", learning_rate=0.1, schedule="constant"), 10, step)
    optimizer.build(model.trainable_variables)
    features = rng.random((24, 8, 8, 1)).astype(np.float32)
    labels = rng.integers(0, 10, 24).astype(np.int32)
    update = SyncUpdate(CLASSIFY, model, optimizer, placement, 3, step, _streams(features, labels, 3))
    kernel = model.get_layer("conv").kernel.numpy()
    update.train_steps(5)
    assert not np.array_equal(model.get_layer("conv").kernel.numpy(), kernel)  # training happened
    np.testing.assert_array_equal(frozen.moving_mean.numpy(), stats[0])
    np.testing.assert_array_equal(frozen.moving_variance.numpy(), stats[1])


def test_a_start_traces_one_step_graph():
    """Every call of a window runs one traced graph (the in-graph loop, the window's last step timed): windows
    of 1, 3 and 2 steps at 2 towers and 4 micro-batches trace it once, and not the one-step graph. A window whose
    last step returns its gradients (histograms) traces the one-step graph, once."""
    model, features, labels = _model_and_batch("mlp")
    placement = devices.place(TowerConfig(num_towers=2, device="cpu", parameter_device="cpu"))
    step = tf.Variable(0, dtype=tf.int64)
    optimizer = optimizers.make_optimizer(OptimizerConfig(name="sgd", learning_rate=0.1, schedule="constant"), 10, step)
    optimizer.build(model.trainable_variables)
    update = SyncUpdate(CLASSIFY, model, optimizer, placement, 4, step, _streams(features, labels, 4))
    traces = lambda: (  # noqa: E731
        update.calls.loop_fn.experimental_get_tracing_count(),
        update.calls.step_fn.experimental_get_tracing_count(),
    )
    results = [update.train_steps(n) for n in (1, 3, 2)]
    assert [r.steps for r in results] == [1, 3, 2]
    assert all(len(r.tower_step_sec) == 2 and min(r.tower_step_sec) > 0 for r in results)  # each window's last step
    assert all(r.loss > 0 and r.learning_rate == pytest.approx(0.1) for r in results)
    assert traces() == (1, 0)
    with_gradients = update.train_steps(2, want_gradients=True)
    assert len(with_gradients.gradients) == len(model.trainable_variables) and min(with_gradients.tower_step_sec) > 0
    assert traces() == (1, 1)
    assert int(step.numpy()) == 8
