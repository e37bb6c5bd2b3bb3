"""towerflow's optimizer update (`trainer.step.update`: the fused kernels, the placed update, the loss-scaled one)
against Keras's own `apply_gradients`, bit for bit, and where its ops run."""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.step.update import fused_kernels, per_device

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
    step = tf.Variable(0.0, trainable=False)  # a callable rate, as trainer.step.update.optimizers builds it

    def rate():
        step.assign_add(1.0)
        return 0.05 * tf.minimum(1.0, step / 7.0)

    return rate


@pytest.mark.quick
@pytest.mark.parametrize("momentum", [0.0, 0.9, 0.6])
def test_fused_sgd_is_keras_bit_for_bit(momentum):
    make = lambda: keras.optimizers.SGD(_schedule(), momentum=momentum)  # noqa: E731
    assert fused_kernels.fusable(make())
    keras_vars, keras_state, _ = _train(make, _keras)
    fused_vars, fused_state, op_types = _train(make, per_device.apply_gradients)
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
def test_other_optimizers_give_keras_bits_without_fused_kernels(optimizer):
    assert not fused_kernels.fusable(optimizer())
    keras_vars, keras_state, _ = _train(optimizer, _keras, steps=3)
    fused_vars, fused_state, op_types = _train(optimizer, per_device.apply_gradients, steps=3)
    assert not [t for t in op_types if t.startswith("ResourceApply")]
    for a, b in zip(keras_vars + keras_state, fused_vars + fused_state, strict=True):
        assert _bits(a) == _bits(b)


_WRITES = {
    "AssignVariableOp",
    "AssignAddVariableOp",
    "AssignSubVariableOp",
    "ResourceApplyGradientDescent",
    "ResourceApplyKerasMomentum",
}


@pytest.mark.parametrize(
    "optimizer, counter_writes",
    [
        (lambda: keras.optimizers.SGD(0.01, momentum=0.9), 1),
        (lambda: keras.optimizers.Adam(0.01), 1),
        (lambda: keras.optimizers.AdamW(0.01, weight_decay=1e-4), 1),
        (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.AdamW(0.01)), 6),
    ],
    ids=["momentum", "adam", "adamw", "loss_scale"],
)
def test_every_write_of_the_update_runs_on_its_variables_device(optimizer, counter_writes):
    """Variables on CPU:0 and CPU:1, the update traced under CPU:2 (the parameter device): every write to a
    variable or its slots runs on that variable's device; only the optimizer's own counters (`iterations`;
    the loss scale's step counter and scale, in its conds' branches) are written on CPU:2."""
    with tf.device("/device:CPU:2"):
        variables = []
        for i, shape in enumerate([(4, 3), (3,), (3, 2)]):
            with tf.device(f"/device:CPU:{i % 2}"):
                variables.append(keras.Variable(np.ones(shape, np.float32), name=f"w{i}"))
        opt = optimizer()
        opt.build(variables)

    @tf.function
    def step_fn(grads):
        with tf.device("/device:CPU:2"):  # as the step calls it: under the parameter device
            per_device.apply_gradients(opt, list(grads), variables)

    graph = step_fn.get_concrete_function([tf.TensorSpec(v.shape, tf.float32) for v in variables]).graph
    # Outside a cond: each write's device is its variable's.
    handle_device = {id(inner): outer.device for outer, inner in graph.captures}
    writes = [op for op in graph.get_operations() if op.type in _WRITES]
    assert all(handle_device[id(op.inputs[0])].endswith(op.device[-5:]) for op in writes)
    # Everywhere, conds' branches included: the writes per device.
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    writes_on = collections.Counter(n.device[-5:] for n in nodes if n.op in _WRITES)
    assert writes_on["CPU:0"] >= 2 and writes_on["CPU:1"] >= 1  # w0, w2 on CPU:0; w1 on CPU:1
    assert sum(writes_on.values()) - writes_on["CPU:0"] - writes_on["CPU:1"] == counter_writes


def test_the_loss_scale_is_skipped_halved_and_doubled_as_keras_does():
    """fp16's optimizer through `trainer.step.update.per_device` against Keras's, over finite steps (the scale doubles
    after `dynamic_growth_steps`) and a non-finite one (skipped, the scale halved): the same bits."""
    steps = _gradients(6)
    steps[2][1][0] = np.inf

    def run(apply):
        rng = np.random.default_rng(1)
        variables = [keras.Variable(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]
        optimizer = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.AdamW(0.01), initial_scale=8.0, dynamic_growth_steps=2
        )
        optimizer.build(variables)
        step_fn = tf.function(lambda grads: apply(optimizer, list(grads), variables))
        scales = []
        for grads in steps:
            step_fn([tf.constant(g) for g in grads])
            scales.append(float(optimizer.dynamic_scale.numpy()))
        return [v.numpy() for v in variables + list(optimizer.variables)], scales

    keras_values, keras_scales = run(_keras)
    values, scales = run(per_device.apply_gradients)
    assert scales == keras_scales == [8.0, 16.0, 8.0, 8.0, 16.0, 16.0]
    assert all(_bits(a) == _bits(b) for a, b in zip(keras_values, values, strict=True))
