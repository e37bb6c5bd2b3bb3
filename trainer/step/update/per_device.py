"""The optimizer update, driven by towerflow: each variable's update on the device that owns it.

Keras's `apply_gradients` builds every variable's arithmetic under the ambient device scope (the parameter
device here) and, outside a `tf.distribute` strategy, routes the gradients through an identity all-reduce
there too. Under `--parameter_device=spread` that would pull every gradient and slot to one device. So
towerflow does not call it for the optimizers it builds (`trainer.step.update.optimizers`): it runs the same steps
itself, through the optimizer's public API, one variable at a time under that variable's device:

- plain SGD and momentum: one fused kernel per variable (`trainer.step.update.fused_kernels`);
- any other optimizer built without the options Keras applies around `update_step` (clipping, EMA,
  gradient accumulation, a loss-scale factor): weight decay as Keras computes it, then `update_step`, then
  the variable's constraint, and one `iterations` += 1 (`placeable`);
- fp16's `LossScaleOptimizer`: the finiteness check, unscaling and scale adjustment as Keras's `apply`
  does them, around the inner optimizer's update above;
- anything else (an option towerflow never sets): Keras's own `apply_gradients`, on the ambient device.

Each path gives the bits of Keras's `apply_gradients` (tests/trainer/step/test_fused.py compares them variable by
variable and slot by slot); only where the ops run changes. Keras creates each slot colocated with its
variable, so the slots need nothing.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from trainer.step.core import spread
from trainer.step.update import fused_kernels


def placeable(optimizer) -> bool:
    """Whether towerflow runs this optimizer's update itself: none of the options Keras applies around
    `update_step` is set (clipping, EMA, gradient accumulation, a loss-scale factor)."""
    return (
        optimizer.clipnorm is None
        and optimizer.clipvalue is None
        and optimizer.global_clipnorm is None
        and not optimizer.use_ema
        and not optimizer.gradient_accumulation_steps
        and optimizer.loss_scale_factor is None
    )


def apply_gradients(optimizer, grads: list, variables: list, learning_rate=None) -> None:
    """Applies `grads` to `variables` as `optimizer.apply_gradients` does, each variable's update on its device.

    `variables`: the list the optimizer was built with, in that order (the fused kernels find each slot by
    position). `learning_rate`: the optimizer's current rate if the caller has it already (the schedule's ops
    then run once per step); read from the optimizer otherwise.
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        _apply_loss_scaled(optimizer, grads, variables, learning_rate)
    elif fused_kernels.fusable(optimizer) and all(v.constraint is None for v in variables):
        fused_kernels.apply(
            optimizer, grads, variables, optimizer.learning_rate if learning_rate is None else learning_rate
        )
    elif placeable(optimizer):
        _apply_placed(optimizer, grads, variables, optimizer.learning_rate if learning_rate is None else learning_rate)
    else:
        optimizer.apply_gradients(zip(grads, variables, strict=True))


def _apply_placed(optimizer, grads: list, variables: list, learning_rate) -> None:
    """Keras's `apply` for a `placeable` optimizer (weight decay, `update_step`, constraint; then the count),
    each variable's part under its device. Keras decays every variable before updating any; the variables
    are independent, so decaying each just before its own update is the same arithmetic."""
    if not optimizer.built:
        optimizer.build(variables)
    for grad, variable in zip(grads, variables, strict=True):
        with tf.device(spread.device_of(variable)):
            var = variable.value if isinstance(variable, keras.Variable) else variable
            if optimizer.weight_decay is not None:  # towerflow's optimizers exclude no variable from it
                # The rate read again here, as Keras reads it for the decay: the same schedule at the same step.
                lr = tf.cast(optimizer.learning_rate, var.dtype)
                var.assign_sub(var * tf.cast(optimizer.weight_decay, var.dtype) * lr)
            optimizer.update_step(grad, var, learning_rate)
            if variable.constraint is not None:
                variable.assign(variable.constraint(variable))
    optimizer.iterations.assign_add(1)


def _apply_loss_scaled(optimizer, grads: list, variables: list, learning_rate) -> None:
    """Keras's `LossScaleOptimizer.apply` (TensorFlow, no strategy): if every gradient is finite, unscale
    them (each on its variable's device), update with the inner optimizer, and double the scale after
    `dynamic_growth_steps` finite steps in a row; otherwise halve the scale and skip the update."""
    inner, scale, counter = optimizer.inner_optimizer, optimizer.dynamic_scale, optimizer.step_counter

    def finite_update():
        unscaled = []
        for grad, variable in zip(grads, variables, strict=True):
            with tf.device(spread.device_of(variable)):
                unscaled.append(keras.ops.divide(grad, scale))
        apply_gradients(inner, unscaled, variables, learning_rate)

        def upscale():
            counter.assign(0)
            scale.assign(keras.ops.multiply(scale, 2.0))

        def increment():
            counter.assign_add(1)

        tf.cond(tf.equal(counter, optimizer.dynamic_growth_steps - 1), upscale, increment)

    def skip():
        counter.assign(0)
        scale.assign(keras.ops.multiply(scale, 0.5))

    tf.cond(optimizer.check_finite(grads), finite_update, skip)
