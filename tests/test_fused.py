"""The fused optimizer update (`trainer.step.fused`) against Keras's own `apply_gradients`, bit for bit."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.step import fused

SHAPES = [(3, 3, 1, 32), (32,), (1024, 128), (128,), (128, 10)]


def _gradients(steps: int, seed: int = 0) -> list[list[np.ndarray]]:
    """Random gradients over many magnitudes (1e-6 .. 10), so rounding differences would show."""
    rng = np.random.default_rng(seed)
    return [
        [rng.standard_normal(s).astype(np.float32) * np.float32(10.0 ** rng.integers(-6, 2)) for s in SHAPES]
        for _ in range(steps)
    ]


def _train(make_optimizer, apply, steps: int = 20):
    """Variables, optimizer variables and graph op types after `steps` updates of `apply` in a tf.function."""
    rng = np.random.default_rng(1)
    variables = [keras.Variable(rng.standard_normal(s).astype(np.float32), name=f"v{i}") for i, s in enumerate(SHAPES)]
    optimizer = make_optimizer()
    optimizer.build(variables)
    step_fn = tf.function(lambda grads: apply(optimizer, list(grads), variables))
    for grads in _gradients(steps):
        step_fn([tf.constant(g) for g in grads])
    graph = step_fn.get_concrete_function([tf.TensorSpec(s, tf.float32) for s in SHAPES]).graph
    op_types = [op.type for op in graph.get_operations()]
    return [v.numpy() for v in variables], [v.numpy() for v in optimizer.variables], op_types


def _bits(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


def _keras(optimizer, grads, variables):
    optimizer.apply_gradients(zip(grads, variables, strict=True))


def _schedule():
    step = tf.Variable(0.0, trainable=False)  # a callable rate, as trainer.step.optim builds it

    def rate():
        step.assign_add(1.0)
        return 0.05 * tf.minimum(1.0, step / 7.0)

    return rate


@pytest.mark.quick
@pytest.mark.parametrize("momentum", [0.0, 0.9, 0.6])
def test_fused_sgd_is_keras_bit_for_bit(momentum):
    make = lambda: keras.optimizers.SGD(_schedule(), momentum=momentum)  # noqa: E731
    assert fused.fusable(make())
    keras_vars, keras_state, _ = _train(make, _keras)
    fused_vars, fused_state, op_types = _train(make, fused.apply_gradients)
    kernel = "ResourceApplyKerasMomentum" if momentum else "ResourceApplyGradientDescent"
    assert op_types.count(kernel) == len(SHAPES)  # the fused path was taken, one op per variable
    for a, b in zip(keras_vars + keras_state, fused_vars + fused_state, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert _bits(a) == _bits(b)  # every bit, signed zeros included
    assert int(fused_state[0]) == 20  # iterations counted as Keras counts them
    assert not np.array_equal(keras_vars[2], _train(make, _keras, steps=0)[0][2])  # the updates did something


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.Adam(0.01),
        lambda: keras.optimizers.AdamW(0.01),
        lambda: keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True),
        lambda: keras.optimizers.SGD(0.01, clipnorm=1.0),
        lambda: keras.optimizers.SGD(0.01, weight_decay=1e-4),
        lambda: keras.optimizers.SGD(0.01, use_ema=True),
        lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01)),
    ],
    ids=["adam", "adamw", "nesterov", "clipnorm", "weight_decay", "ema", "loss_scale"],
)
def test_other_optimizers_take_keras_path(optimizer):
    assert not fused.fusable(optimizer())
    keras_vars, keras_state, _ = _train(optimizer, _keras, steps=3)
    fused_vars, fused_state, op_types = _train(optimizer, fused.apply_gradients, steps=3)
    assert not [t for t in op_types if t.startswith("ResourceApply")]
    for a, b in zip(keras_vars + keras_state, fused_vars + fused_state, strict=True):
        assert _bits(a) == _bits(b)
