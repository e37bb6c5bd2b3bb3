"""What one tower does with one micro-batch, and the fixed-order reductions on the parameter device.

A micro-batch is run with `model.stateless_call`: the tower reads the variables' current values (copied
from the parameter device), and returns its gradients and the new values of the non-trainable state
(BatchNorm moving statistics) instead of assigning them. The caller combines those in micro-batch index
order, so the result does not depend on which tower ran which micro-batch, nor on how many towers there are.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import keras
import numpy as np
import tensorflow as tf

from tasks import TaskError
from trainer.step import tree, update

# How the loss and gradient are reduced over the global batch (recorded in run.json: it decides the bits): the
# sums of loss * weight and of the weights along the fixed tree, divided once by the global weight.
LOSS_REDUCTION = "weighted_sum"

# Room for this many random draws per layer per micro-batch before two micro-batches' seeds could overlap.
_DRAWS_PER_MICRO_BATCH = 1024


@dataclasses.dataclass
class MicroBatchResult:
    """The outputs of one micro-batch (all tensors on the tower's device), as sums: nothing is divided by the
    micro-batch's size; `combine` divides once, by the global weight."""

    loss: tf.Tensor  # sum of loss * weight over the micro-batch (without regularisation), float32
    weight: tf.Tensor  # sum of the weights, float32
    metrics: dict  # the task's {name: (sum, count)}, float32
    grads: list[tf.Tensor]  # d(loss + weight * regularisation)/d(trainable), one per trainable variable
    non_trainable: list[tf.Tensor]  # new values of the model's non-trainable variables

    def flat(self) -> tuple:
        """The result as a flat tuple (an XLA-compiled function's return value); `unflat` inverts it."""
        return (self.loss, self.weight, self.metrics, self.grads, self.non_trainable)


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


def run_micro_batch(task, model, trainable, non_trainable, batch, loss_scale=None) -> MicroBatchResult:
    """Forward and backward pass of one micro-batch with the given variable values.

    The task's per-example (or per-token) losses and weights are summed here; the gradient is that of
    sum(loss * weight) + sum(weight) * regularisation, so that after the engine's one division by the global
    weight the regularisation counts once and each example (token) by its weight, whatever the micro-batch
    holds.

    Args:
      task: the run's `tasks.Task` (`model_inputs`, `loss`, `metrics`).
      model: its Keras model.
      trainable, non_trainable: values for `model.trainable_variables` / `model.non_trainable_variables`.
      batch: the micro-batch, as the task's records give it.
      loss_scale: optional scalar to multiply the loss by before differentiation (fp16, so small gradients
        do not underflow); the gradients come back scaled, and the loss-scale optimizer unscales them.
    """
    with tf.GradientTape() as tape:
        tape.watch(trainable)
        outputs, new_non_trainable, losses = model.stateless_call(
            trainable, non_trainable, task.model_inputs(batch), training=True, return_losses=True
        )
        outputs = tf.nest.map_structure(float32, outputs)
        loss, weight = weighted_sums(task, outputs, batch)
        total = loss + weight * tf.add_n([tf.cast(x, tf.float32) for x in losses]) if losses else loss
        if loss_scale is not None:
            # fp16: the backward pass runs in 16 bits, where a sum over the micro-batch's examples (tokens)
            # would overflow at the loss scale a mean fits in; differentiate the mean, scaled, and multiply the
            # float32 gradients by the weight after (below).
            total = per_weight(total, weight) * loss_scale
    # An embedding's gradient comes as IndexedSlices (the rows the batch used): made dense here, so every
    # gradient is summed along the tree the same way.
    grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in tape.gradient(total, trainable)]
    if loss_scale is not None:
        grads = [g * tf.cast(weight, g.dtype) for g in grads]
    return MicroBatchResult(loss, weight, task_metrics(task, outputs, batch), grads, new_non_trainable)


def weighted_sums(task, outputs, batch) -> tuple[tf.Tensor, tf.Tensor]:
    """(sum of loss * weight, sum of weights) of the task's losses on one micro-batch, float32."""
    losses, weights = task.loss(outputs, batch)
    losses, weights = tf.cast(losses, tf.float32), tf.stop_gradient(tf.cast(weights, tf.float32))
    return tf.reduce_sum(losses * weights), tf.reduce_sum(weights)


def task_metrics(task, outputs, batch) -> dict:
    """The task's {name: (sum, count)} as float32, in `task.metric_names`' order.

    Raises:
      tasks.TaskError: the task returned other names than its `metric_names` declare.
    """
    metrics = task.metrics(outputs, batch)
    if tuple(metrics) != tuple(task.metric_names):
        raise TaskError(
            f"task {task.name!r}: metrics() returned {sorted(metrics)}, but metric_names declares "
            f"{list(task.metric_names)} (same names, same order)"
        )
    return {name: (tf.cast(s, tf.float32), tf.cast(c, tf.float32)) for name, (s, c) in metrics.items()}


def check_task(task, model, element_spec, length: int = 1) -> None:
    """Runs the task's model, loss and metrics once, eagerly, on a batch of one zero example shaped as
    `element_spec` says (unknown lengths: `length`, a length a padded batch can have), so that a task whose
    pieces do not fit together is refused before its step traces (an error inside a traced step surfaces
    wrapped in TensorFlow's staging error).

    Raises:
      tasks.TaskError: `loss` gives losses and weights of different shapes, or `metrics` other names than
        `metric_names`.
    """
    shapes = [[length if d is None else d for d in [1, *spec.shape[1:]]] for spec in tf.nest.flatten(element_spec)]
    zeros = [tf.zeros(shape, spec.dtype) for shape, spec in zip(shapes, tf.nest.flatten(element_spec), strict=True)]
    batch = tf.nest.pack_sequence_as(element_spec, zeros)
    outputs = tf.nest.map_structure(float32, model(task.model_inputs(batch), training=False))
    losses, weights = task.loss(outputs, batch)
    if tuple(losses.shape) != tuple(weights.shape):
        raise TaskError(
            f"task {task.name!r}: loss() gave losses of shape {tuple(losses.shape)} and weights of shape "
            f"{tuple(weights.shape)}; they must have the same shape (one weight per loss)"
        )
    task_metrics(task, outputs, batch)


def now(anchor: tf.Tensor) -> tf.Tensor:
    """Wall-clock seconds as a graph op, taken once the control dependencies around it are met.

    A stateless host callback on a runtime value: `tf.timestamp` is refused under op determinism, and a
    stateful callback (`tf.py_function`) is chained to every other stateful op in the order the function was
    traced (tf.function's automatic control dependencies), which made each tower's clock wait for the
    previous tower's and so ran the towers one after another on every timed step. `anchor` (a runtime
    scalar, e.g. the global step) is copied under the caller's control dependencies, so the callback cannot be
    constant-folded or merged with another clock.
    """
    return tf.numpy_function(_seconds, [tf.identity(anchor)], tf.float64, stateful=False)


def _seconds(_) -> np.float64:
    return np.float64(time.perf_counter())


def float32(tensor):
    """Mixed precision computes in 16 bits; the loss and metrics see float32 outputs."""
    return tf.cast(tensor, tf.float32) if tensor.dtype.is_floating else tensor


def batch_size(element_spec) -> int:
    """Examples in a batch of this spec: the leading dimension of its first tensor (every tensor has it)."""
    return int(tf.nest.flatten(element_spec)[0].shape[0])


def zero_metrics(task) -> dict:
    """{name: (0, 0)} for each of the task's metrics: where the sums of a window start."""
    return {name: (tf.constant(0.0), tf.constant(0.0)) for name in task.metric_names}


def add_metrics(a: dict, b: dict) -> dict:
    """Two {name: (sum, count)} added name by name."""
    return {name: (a[name][0] + b[name][0], a[name][1] + b[name][1]) for name in a}


def metric_values(metrics: dict) -> dict:
    """{name: sum / count} as host floats (None where nothing was counted)."""
    values = {}
    for name, (total, count) in metrics.items():
        count = float(count)
        values[name] = float(total) / count if count else None
    return values


def loss_scale(optimizer):
    """The current loss scale of a `keras.optimizers.LossScaleOptimizer` (fp16), else None."""
    scale = getattr(optimizer, "dynamic_scale", None)
    return None if scale is None else tf.identity(scale.value)


def micro_batch_fn(task, model, jit_compile: bool = False):
    """Returns `run_micro_batch` bound to `task` and `model`, XLA-compiled per call site when `jit_compile`.

    XLA compiles for one device, so the unit it compiles is one tower's forward and backward pass (called
    under that tower's device scope); the reduction across towers and the update stay in the ordinary graph.
    """
    if not jit_compile:
        return functools.partial(run_micro_batch, task, model)

    @tf.function(jit_compile=True)
    def compiled(trainable, non_trainable, batch, loss_scale=None):
        return run_micro_batch(task, model, trainable, non_trainable, batch, loss_scale).flat()

    def run(trainable, non_trainable, batch, loss_scale=None):
        return MicroBatchResult(*compiled(trainable, non_trainable, batch, loss_scale))

    return run


def combine(results: list[MicroBatchResult], seed_flags: list[bool], old_state, owners, mirrors):
    """Reduces per-micro-batch results along the fixed tree (`trainer.step.tree`), and divides once.

    The loss, weight and metric sums and each variable's gradient are summed along the tree; each gradient
    (and the loss) is then divided by the global weight, on the variable's owner: the mean over every weighted
    example (token) of the global batch, the same for any number of towers and tasks at fixed K. A gradient is
    summed on its owner, or, for a subtree one task holds, on that task's twin of the owner, so only one
    partial sum per subtree crosses between tasks. A mirrored variable's gradient is all-reduced instead, a
    copy on every task (`trainer.step.mirrors`).

    Args:
      old_state: per task, the non-trainable values its micro-batches started from (`Layout.fanout`).
      owners: (devices of the trainable variables, devices of the non-trainable variables, the device of
        the loss and metric sums).
      mirrors: the run's `trainer.step.mirrors.Mirrors` (its `layout`: which task holds each micro-batch).

    Returns:
      (loss per weight, {name: (sum, count)} of the task's metrics, gradients per weight, new non-trainable
      values or None for seed states, and per task {index: gradient per weight} of the mirrored variables'
      replicas there).
    """
    layout = mirrors.layout
    floating, state_lists = _state_leaves(results, seed_flags, old_state, owners[1], layout)
    weight, loss_sum, metrics, totals, states = _tree_sums(results, owners, mirrors, floating, state_lists)
    with tf.device(owners[2]):
        loss = per_weight(loss_sum, weight)
    grads, replica_grads = [], {task: {} for task in range(layout.num_tasks)}
    for i, device in enumerate(owners[0]):
        if i in totals:
            with tf.device(device):
                grads.append(per_weight(totals[i], weight))
            continue
        means = _all_reduced_means(mirrors, i, [r.grads[i] for r in results], device, weight)
        grads.append(means.pop(layout.task_of_device(device)))
        for task, mean in means.items():
            replica_grads[task][i] = mean
    new_state = _new_states(results, seed_flags, old_state, owners[1], layout, dict(zip(floating, states, strict=True)))
    return loss, metrics, grads, new_state, replica_grads


def _tree_sums(results: list[MicroBatchResult], owners, mirrors, floating: list[int], state_lists: list) -> tuple:
    """The tree sums of the weights, losses and metric sums and counts (placed for `owners[2]`), of the
    gradients of the variables owned whole (for their owners) and of the state leaves of the `floating`
    non-trainable variables (`_state_leaves`, for theirs), as one `Layout.tree_sums`: under
    `--fuse_transfers` what crosses between tasks goes fused (`trainer.step.fusion`). Returns (weight, loss,
    metrics, {index: gradient}, [(sum, unchanged)] of the state)."""
    names = list(results[0].metrics)
    whole = [i for i in range(len(owners[0])) if i not in mirrors.homes]
    leaf_lists = [[r.weight for r in results], [r.loss for r in results]]
    leaf_lists += [[r.metrics[name][part] for r in results] for name in names for part in (0, 1)]
    leaf_lists += [[r.grads[i] for r in results] for i in whole]
    devices = [owners[2]] * (2 + 2 * len(names)) + [owners[0][i] for i in whole] + [owners[1][i] for i in floating]
    sums = mirrors.layout.tree_sums(leaf_lists + state_lists, devices, _sum_or_all)
    metrics = {name: (sums[2 + 2 * n], sums[3 + 2 * n]) for n, name in enumerate(names)}
    grads = sums[2 + 2 * len(names) : len(leaf_lists)]
    return sums[0], sums[1], metrics, dict(zip(whole, grads, strict=True)), sums[len(leaf_lists) :]


def _sum_or_all(a, b):
    """Two leaves (tensors, or tuples of them) combined along the tree: summed, booleans AND-ed."""
    return tf.nest.map_structure(lambda x, y: tf.logical_and(x, y) if x.dtype == tf.bool else x + y, a, b)


def per_weight(total: tf.Tensor, weight: tf.Tensor) -> tf.Tensor:
    """`total / weight`, 0 where nothing had weight (a batch of padding moves no weight)."""
    return tf.math.divide_no_nan(total, tf.cast(weight, total.dtype))


def _all_reduced_means(mirrors, index: int, leaves: list, home: str, weight: tf.Tensor) -> dict:
    """Per task, mirrored variable `index`'s gradients `leaves` summed and divided by the global `weight`, on
    the task's twin of `home`."""
    means = {}
    for task, total in mirrors.all_reduce(index, leaves).items():
        with tf.device(mirrors.layout.twin(home, task)):
            means[task] = per_weight(total, weight)
    return means


def _state_leaves(results: list[MicroBatchResult], seed_flags, old_state, owners, layout: tree.Layout) -> tuple:
    """The floating non-trainable variables (not seed states) and, per variable, its K leaves (micro-batch
    value, whether it equals the old value) to combine along the tree; `old_state[t]` is task t's copy of the
    values the micro-batches started from, `owners` the variables' devices."""
    # BatchNorm: mean of the K updates from the same old value == one update with the mean micro-batch
    # statistic; the same for every tower count. Where no micro-batch changed a value (frozen BatchNorm,
    # Normalization), (K * x) / K can differ from x by an ulp unless K is a power of two: keep x itself
    # there, so untouched state never drifts. "Unchanged" is an AND, combined along the same tree.
    floating = [i for i, flag in enumerate(seed_flags) if not flag and results[0].non_trainable[i].dtype.is_floating]
    leaf_lists = []
    for i in floating:
        place, leaves = layout.placer(owners[i]), []
        for j, result in enumerate(results):
            value = result.non_trainable[i]
            with tf.device(place(j, j + 1)):
                leaves.append((value, tf.equal(value, old_state[layout.task_of_micro_batch(j)][i])))
        leaf_lists.append(leaves)
    return floating, leaf_lists


def _new_states(results, seed_flags, old_state, owners, layout: tree.Layout, combined: dict) -> list:
    """Each non-trainable variable's new value: None for a seed state, the last micro-batch's for an integer,
    else the mean of the micro-batches' values, or the old value where none changed it (`combined`: index ->
    (sum, unchanged) along the tree)."""
    new_state = [None if flag else results[-1].non_trainable[i] for i, flag in enumerate(seed_flags)]
    for i, (total, unchanged) in combined.items():
        with tf.device(owners[i]):
            old = old_state[layout.task_of_device(owners[i])][i]
            new_state[i] = tf.where(unchanged, old, _mean(total, len(results)))
    return new_state


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
