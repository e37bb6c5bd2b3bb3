"""The optimizer update as one fused kernel per variable, where that gives Keras's update bit for bit.

Keras 3's `SGD.update_step` builds its update from element-wise ops (~8 graph ops per variable: casts, two
multiplies, a subtract, the assigns), and `apply_gradients` adds its own bookkeeping around them. TensorFlow's
training kernels do the same arithmetic in one op per variable: `ResourceApplyGradientDescent` computes
`var - grad * lr`, `ResourceApplyKerasMomentum` computes `accum = accum * momentum - grad * lr; var += accum`,
the same float32 operations in the same order as Keras's (tests/trainer/step/test_fused.py compares the bits over steps
of random gradients). On a short step those ops are a measurable share of the time (`benchmarks/results/keras.md`,
"Against Keras `model.fit`"), and async mode pays them once per micro-batch.

Only plain SGD, with or without momentum, takes the fused path: Adam's fused kernel rounds differently from
Keras's (up to ~1e-6 apart after 30 steps), and anything that changes the update (Nesterov, weight decay,
clipping inside the optimizer, EMA, gradient accumulation, loss scaling, variable constraints) takes one of
the other paths of `trainer.step.update.per_device`, which chooses.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from trainer.step.core import spread


def fusable(optimizer) -> bool:
    """Whether this optimizer's update can be the fused kernels (`trainer.step.update.per_device` then takes them)."""
    return (
        type(optimizer) is keras.optimizers.SGD
        and not optimizer.nesterov
        and optimizer.clipnorm is None
        and optimizer.clipvalue is None
        and optimizer.global_clipnorm is None
        and not optimizer.weight_decay
        and not optimizer.use_ema
        and not optimizer.gradient_accumulation_steps
        and optimizer.loss_scale_factor is None
    )


def apply(optimizer, grads: list, variables: list, learning_rate) -> None:
    """Applies `grads` to `variables` with one fused kernel per variable, on the variable's device, as
    `optimizer.apply_gradients` would for a `fusable` optimizer; `learning_rate` is its current rate.

    `variables` is the list the optimizer was built with, in that order: Keras keeps one momentum slot per
    variable in that order, so the i-th slot is the i-th variable's. The optimizer's own slots and
    `iterations` are the ones updated, so checkpoints and a later `apply_gradients` see the same state.
    """
    if not optimizer.built:
        optimizer.build(variables)
    if optimizer.momentum and len(optimizer.momentums) != len(variables):
        raise ValueError(f"{len(variables)} variables for an optimizer built with {len(optimizer.momentums)}")
    constants = {}  # (dtype, device) -> the learning rate and momentum there, built once
    for index, (grad, variable) in enumerate(zip(grads, variables, strict=True)):
        var = variable.value if isinstance(variable, keras.Variable) else variable
        device = spread.device_of(variable)
        with tf.device(device):  # where Keras's update runs too: with its variable
            key = (var.dtype, device)
            if key not in constants:
                constants[key] = (tf.cast(learning_rate, var.dtype), tf.constant(optimizer.momentum, var.dtype))
            (lr, momentum), grad = constants[key], tf.cast(grad, var.dtype)
            if optimizer.momentum == 0:
                tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=lr, delta=grad)
                continue
            accum = optimizer.momentums[index].value
            tf.raw_ops.ResourceApplyKerasMomentum(
                var=var.handle, accum=accum.handle, lr=lr, grad=grad, momentum=momentum, use_nesterov=False
            )
    optimizer.iterations.assign_add(1)
