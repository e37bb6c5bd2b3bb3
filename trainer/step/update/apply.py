"""The one update both modes apply, and the head their updaters share.

`apply_update` is one optimizer update of the shared variables: clip, the optimizer (each variable's part on its
owner's device, `per_device`), the new BatchNorm statistics, global step + 1; a non-finite loss or gradient is
not applied. `BaseUpdate` is what `SyncUpdate` and `AsyncUpdate` both hold (the task, the model and its
optimizer, the placement, the global step, the input streams, the clip) and their one call of it.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from trainer.step.stepper import Updater
from trainer.step.update import per_device


class BaseUpdate(Updater):
    """The head both update modes share: what they update, and how they apply one update.

    Args:
      task: the run's `tasks.Task` (its loss and metrics).
      model: the task's Keras model whose variables live on `placement.parameter_device` or, spread, each
        on its owner (`trainer.step.core.spread`).
      optimizer: built Keras optimizer (slots on the parameter device).
      placement: tower and parameter devices.
      global_step: int64 `tf.Variable` on the parameter device; +1 per update.
      iterators: the mode's input streams (`trainer.loop.inputs.PlacedIterator`s).
      clip_global_norm: clip each update's gradient to this global norm; 0 turns clipping off.
    """

    def __init__(self, task, model, optimizer, placement, global_step, iterators, clip_global_norm: float = 0.0):
        self.task = task
        self.model = model
        self.optimizer = optimizer
        self.placement = placement
        self.global_step = global_step
        self.iterators = list(iterators)
        self.clip_global_norm = clip_global_norm

    def apply_update(self, loss, grads, new_state, loss_scale, also=None) -> dict:
        """`apply_update` of this model, optimizer, global step and clip (call under the parameter device)."""
        model, optimizer, step, clip = self.model, self.optimizer, self.global_step, self.clip_global_norm
        return apply_update(model, optimizer, step, loss, grads, new_state, loss_scale, clip, also)


def loss_scale(optimizer):
    """The current loss scale of a `keras.optimizers.LossScaleOptimizer` (fp16), else None."""
    scale = getattr(optimizer, "dynamic_scale", None)
    return None if scale is None else tf.identity(scale.value)


def apply_update(
    model, optimizer, global_step, loss, grads, new_state, loss_scale, clip_global_norm: float, also=None
) -> dict:
    """One optimizer update of the shared variables (call under the parameter device); shared by the modes.

    A non-finite loss or gradient is never applied (without fp16 loss scaling, whose optimizer skips such
    updates and lowers the scale by itself): the variables and the step stay as they were and `finite` says
    so, for the caller to stop the run (`trainer.system.stop.Diverged`).

    Args:
      loss: the loss the gradients are of.
      grads: the gradient to apply, one per trainable variable (scaled by `loss_scale` if not None).
      new_state: new values of the non-trainable variables; None leaves one as it is.
      loss_scale: the fp16 loss scale the gradients carry, or None.
      clip_global_norm: clip the true (unscaled) gradient to this global norm; 0 turns clipping off.
      also: called with the clipping (list of gradients -> list, the identity when off) inside the update,
        after the optimizer's: the mirrored variables' replicas update there (`trainer.step.transfers.mirrors`).

    Returns:
      {"step": step after the update, "finite", "learning_rate", "grad_norm" (unscaled, before clipping),
      "gradients"}.
    """
    scaled_norm = tf.linalg.global_norm(grads)
    scale = 1.0 if loss_scale is None else tf.cast(loss_scale, scaled_norm.dtype)
    clip = functools.partial(_clip, limit=clip_global_norm, scale=scale, norm=scaled_norm)
    grads = clip(grads)
    learning_rate = tf.cast(optimizer.learning_rate, tf.float32)

    def apply_all():
        per_device.apply_gradients(optimizer, grads, model.trainable_variables, learning_rate)
        _assign_state(model, new_state)
        if also is not None:
            also(clip)
        return global_step.assign_add(1)

    finite, step = _unless_not_finite(apply_all, loss, scaled_norm, loss_scale, global_step)
    norm = scaled_norm / scale
    return {"step": step, "finite": finite, "learning_rate": learning_rate, "grad_norm": norm, "gradients": grads}


def _clip(tensors: list, limit: float, scale, norm) -> list:
    """`tensors` (scaled by `scale`, of global norm `norm`) clipped so the true gradient's norm is at most
    `limit`; as they are when `limit` is 0."""
    if not limit:
        return tensors
    # Clipping a scaled gradient to (clip * scale) is clipping the true gradient to clip.
    return tf.clip_by_global_norm(tensors, limit * scale, use_norm=norm)[0]


def _assign_state(model, new_state: list) -> None:
    """The new values of the non-trainable variables assigned, each where it lives; None leaves one as it is."""
    for variable, value in zip(model.non_trainable_variables, new_state, strict=True):
        if value is not None:
            with tf.device(variable.value.device):  # where the assign runs anyway: with its variable
                variable.assign(value)


def _unless_not_finite(apply_all, loss, scaled_norm, loss_scale, global_step):
    """(finite, step after): `apply_all()` when the loss and gradient are finite, else the step as it was; with
    fp16's loss scale always (its optimizer skips a non-finite update and lowers the scale itself)."""
    if loss_scale is None:
        finite = tf.logical_and(tf.math.is_finite(loss), tf.math.is_finite(scaled_norm))
        return finite, tf.cond(finite, apply_all, global_step.read_value)
    return tf.constant(True), apply_all()
