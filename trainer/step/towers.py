"""What one tower does with one micro-batch, and the fixed-order reductions on the parameter device.

A micro-batch is run with `model.stateless_call`: the tower reads the variables' current values (copied
from the parameter device), and returns its gradients and the new values of the non-trainable state
(BatchNorm moving statistics) instead of assigning them. The caller combines those in micro-batch index
order, so the result does not depend on which tower ran which micro-batch, nor on how many towers there are.
"""

from __future__ import annotations

import dataclasses
import functools

import keras
import tensorflow as tf

from trainer.step import tree, update

# Room for this many random draws per layer per micro-batch before two micro-batches' seeds could overlap.
_DRAWS_PER_MICRO_BATCH = 1024


@dataclasses.dataclass
class MicroBatchResult:
    """The outputs of one micro-batch (all tensors on the tower's device)."""

    loss: tf.Tensor  # mean cross-entropy over the micro-batch (without regularisation)
    correct: tf.Tensor  # number of examples whose arg-max logit is the label
    grads: list[tf.Tensor]  # d(loss + regularisation)/d(trainable), one per trainable variable
    non_trainable: list[tf.Tensor]  # new values of the model's non-trainable variables


def is_seed_state(variable: keras.Variable) -> bool:
    """True for a Keras SeedGenerator state (Dropout and other random layers draw from it)."""
    return variable.name == "seed_generator_state"


def micro_batch_seeds(non_trainable: list[tf.Tensor], flags: list[bool], step, index: int, count: int):
    """Returns `non_trainable` with every seed state replaced by one keyed on (seed, step, micro-batch).

    A SeedGenerator state is a pair [seed, counter]; Keras draws with stateless ops seeded by it and bumps the
    counter. Keeping the seed and setting the counter to a function of (step, micro-batch index) gives each
    micro-batch its own randomness, the same whichever tower runs it.
    """
    out = []
    for value, seed_flag in zip(non_trainable, flags, strict=True):
        if seed_flag:
            counter = (tf.cast(step, value.dtype) * count + index) * _DRAWS_PER_MICRO_BATCH
            value = tf.stack([value[0], counter])
        out.append(value)
    return out


def run_micro_batch(model, trainable, non_trainable, features, labels, loss_scale=None) -> MicroBatchResult:
    """Forward and backward pass of one micro-batch with the given variable values.

    Args:
      model: a Keras model returning logits.
      trainable, non_trainable: values for `model.trainable_variables` / `model.non_trainable_variables`.
      features, labels: the micro-batch; labels are int class indices.
      loss_scale: optional scalar to multiply the loss by before differentiation (fp16, so small gradients
        do not underflow); the gradients come back scaled, and the loss-scale optimizer unscales them.
    """
    with tf.GradientTape() as tape:
        tape.watch(trainable)
        logits, new_non_trainable, losses = model.stateless_call(
            trainable, non_trainable, features, training=True, return_losses=True
        )
        logits = tf.cast(logits, tf.float32)
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        total = loss + tf.add_n([tf.cast(x, tf.float32) for x in losses]) if losses else loss
        if loss_scale is not None:
            total = total * loss_scale
    grads = tape.gradient(total, trainable)
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=labels.dtype), labels), tf.int32))
    return MicroBatchResult(loss, correct, grads, new_non_trainable)


def loss_scale(optimizer):
    """The current loss scale of a `keras.optimizers.LossScaleOptimizer` (fp16), else None."""
    scale = getattr(optimizer, "dynamic_scale", None)
    return None if scale is None else tf.identity(scale.value)


def micro_batch_fn(model, jit_compile: bool = False):
    """Returns `run_micro_batch` bound to `model`, XLA-compiled per call site when `jit_compile`.

    XLA compiles for one device, so the unit it compiles is one tower's forward and backward pass (called
    under that tower's device scope); the reduction across towers and the update stay in the ordinary graph.
    """
    if not jit_compile:
        return functools.partial(run_micro_batch, model)

    @tf.function(jit_compile=True)
    def compiled(trainable, non_trainable, features, labels, loss_scale=None):
        r = run_micro_batch(model, trainable, non_trainable, features, labels, loss_scale)
        return r.loss, r.correct, r.grads, r.non_trainable

    def run(trainable, non_trainable, features, labels, loss_scale=None):
        return MicroBatchResult(*compiled(trainable, non_trainable, features, labels, loss_scale))

    return run


def combine(results: list[MicroBatchResult], seed_flags: list[bool], old_state, owners, mirrors):
    """Reduces per-micro-batch results along the fixed tree (`trainer.step.tree`).

    Each variable's gradients and new values are summed on its owner, or, for a subtree one task holds, on
    that task's twin of the owner, so only one partial sum per subtree crosses between tasks. A mirrored
    variable's gradient is all-reduced instead, a copy on every task (`trainer.step.mirrors`).

    Args:
      old_state: per task, the non-trainable values its micro-batches started from (`Layout.fanout`).
      owners: (devices of the trainable variables, devices of the non-trainable variables, the device of
        the loss and accuracy sums).
      mirrors: the run's `trainer.step.mirrors.Mirrors` (its `layout`: which task holds each micro-batch).

    Returns:
      (mean loss, total correct, mean gradients, new non-trainable values or None for seed states, and per
      task {index: mean gradient} of the mirrored variables' replicas there).
    """
    k, layout = len(results), mirrors.layout
    scalars = layout.placer(owners[2])
    loss_sum = tree.tree_sum([r.loss for r in results], scalars)
    correct = tree.tree_sum([r.correct for r in results], scalars)
    with tf.device(owners[2]):
        loss = _mean(loss_sum, k)
    grads, replica_grads = [], {task: {} for task in range(layout.num_tasks)}
    for i, (device, g) in enumerate(zip(owners[0], zip(*(r.grads for r in results), strict=True), strict=True)):
        if i not in mirrors.homes:
            total = tree.tree_sum(list(g), layout.placer(device))
            with tf.device(device):
                grads.append(_mean(total, k))
            continue
        means = _all_reduced_means(mirrors, i, list(g), device)
        grads.append(means.pop(layout.task_of_device(device)))
        for task, mean in means.items():
            replica_grads[task][i] = mean
    new_state = []
    for i, (seed_flag, device) in enumerate(zip(seed_flags, owners[1], strict=True)):
        values = [r.non_trainable[i] for r in results]
        old = [task_state[i] for task_state in old_state]
        new_state.append(None if seed_flag else _combine_state(values, old, device, layout))
    return loss, correct, grads, new_state, replica_grads


def _all_reduced_means(mirrors, index: int, leaves: list, home: str) -> dict:
    """Per task, the mean of mirrored variable `index`'s gradients `leaves`, on the task's twin of `home`."""
    means = {}
    for task, total in mirrors.all_reduce(index, leaves).items():
        with tf.device(mirrors.layout.twin(home, task)):
            means[task] = _mean(total, len(leaves))
    return means


def _combine_state(values: list[tf.Tensor], old: list[tf.Tensor], owner: str, layout: tree.Layout):
    """One non-trainable variable's new value from its K micro-batch values; `old[t]` is task t's copy of
    the value they started from."""
    if not values[0].dtype.is_floating:
        return values[-1]
    # BatchNorm: mean of the K updates from the same old value == one update with the mean micro-batch
    # statistic; the same for every tower count. Where no micro-batch changed a value (frozen BatchNorm,
    # Normalization), (K * x) / K can differ from x by an ulp unless K is a power of two: keep x itself
    # there, so untouched state never drifts. "Unchanged" is an AND, combined along the same tree.
    place, leaves = layout.placer(owner), []
    for j, value in enumerate(values):
        with tf.device(place(j, j + 1)):
            leaves.append((value, tf.equal(value, old[layout.task_of_micro_batch(j)])))
    total, unchanged = tree.reduce(leaves, lambda a, b: (a[0] + b[0], tf.logical_and(a[1], b[1])), place)
    with tf.device(owner):
        return tf.where(unchanged, old[layout.task_of_device(owner)], _mean(total, len(values)))


def _mean(total: tf.Tensor, count: int) -> tf.Tensor:
    """`total / count`; for one micro-batch `total` itself, which is the same bits (x / 1 == x exactly) without
    the divide op on every variable of every step."""
    return total if count == 1 else total / tf.cast(count, total.dtype)


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
        after the optimizer's: the mirrored variables' replicas update there (`trainer.step.mirrors`).

    Returns:
      {"step": step after the update, "finite", "learning_rate", "grad_norm" (unscaled, before clipping),
      "gradients"}.
    """
    scaled_norm = tf.linalg.global_norm(grads)
    scale = 1.0 if loss_scale is None else tf.cast(loss_scale, scaled_norm.dtype)

    def clip(tensors: list) -> list:
        if not clip_global_norm:
            return tensors
        # Clipping a scaled gradient to (clip * scale) is clipping the true gradient to clip.
        return tf.clip_by_global_norm(tensors, clip_global_norm * scale, use_norm=scaled_norm)[0]

    grads = clip(grads)
    learning_rate = tf.cast(optimizer.learning_rate, tf.float32)

    def apply_all():
        update.apply_gradients(optimizer, grads, model.trainable_variables, learning_rate)
        for variable, value in zip(model.non_trainable_variables, new_state, strict=True):
            if value is not None:
                with tf.device(variable.value.device):  # where the assign runs anyway: with its variable
                    variable.assign(value)
        if also is not None:
            also(clip)
        return global_step.assign_add(1)

    if loss_scale is None:
        finite = tf.logical_and(tf.math.is_finite(loss), tf.math.is_finite(scaled_norm))
        step = tf.cond(finite, apply_all, global_step.read_value)
    else:
        finite, step = tf.constant(True), apply_all()
    return {
        "step": step,
        "finite": finite,
        "learning_rate": learning_rate,
        "grad_norm": scaled_norm / scale,
        "gradients": grads,
    }


def first_non_finite(losses) -> tf.Tensor:
    """Index of the first non-finite loss in micro-batch order, -1 if all are finite."""
    bad = tf.logical_not(tf.math.is_finite(tf.stack(losses)))
    # A select, not a cond: both sides are a few scalar ops, and a cond's switches cost more on every step.
    return tf.where(tf.reduce_any(bad), tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int32), -1)


def all_finite(variables) -> bool:
    """Whether every floating-point variable holds only finite values (checked before a save or export)."""
    checks = [tf.reduce_all(tf.math.is_finite(v)) for v in variables if tf.as_dtype(v.dtype).is_floating]
    return bool(tf.reduce_all(tf.stack(checks))) if checks else True
