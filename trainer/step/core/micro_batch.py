"""What one tower does with one micro-batch.

A micro-batch is run with `model.stateless_call`: the tower reads the variables' current values (copied
from the parameter device), and returns its gradients and the new values of the non-trainable state
(BatchNorm moving statistics) instead of assigning them. The caller combines those in micro-batch index
order (`trainer.step.core.combine`), so the result does not depend on which tower ran which micro-batch, nor on how
many towers there are.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import time

import keras
import numpy as np
import tensorflow as tf

from models import vocab_shards
from tasks import TaskError
from trainer.system import graphs

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


def training_flag(model: keras.Model, training: bool) -> dict:
    """`{"training": training}` for a model whose `call` takes it, else `{}`: `stateless_call` passes its
    keyword arguments to `call` as they are, where `model(...)` drops a `training` that `call` does not name
    (a subclassed model's `call(self, inputs)` is a valid Keras model)."""
    parameters = inspect.signature(model.call).parameters.values()
    takes = any(p.name == "training" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    return {"training": training} if takes else {}


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
            trainable, non_trainable, task.model_inputs(batch), return_losses=True, **training_flag(model, True)
        )
        outputs = tf.nest.map_structure(float32, vocab_shards.for_task(task, model, outputs))
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
    outputs = model(task.model_inputs(batch), training=False)
    outputs = tf.nest.map_structure(float32, vocab_shards.for_task(task, model, outputs))
    losses, weights = task.loss(outputs, batch)
    if tuple(losses.shape) != tuple(weights.shape):
        raise TaskError(
            f"task {task.name!r}: loss() gave losses of shape {tuple(losses.shape)} and weights of shape "
            f"{tuple(weights.shape)}; they must have the same shape (one weight per loss)"
        )
    task_metrics(task, outputs, batch)


def now(anchor: tf.Tensor, timed=True) -> tf.Tensor:
    """Wall-clock seconds as a graph op, taken once the control dependencies around it are met; 0 when not
    `timed`. `timed` is a bool when the step is traced for one kind of call, or a bool tensor when one traced
    step serves timed and untimed steps (the in-graph loop, whose last step is timed): then the clock sits in
    a `tf.cond` (see `clocked` for the steps that build no clock at all).

    A stateless host callback on a runtime value: `tf.timestamp` is refused under op determinism, and a
    stateful callback (`tf.py_function`) is chained to every other stateful op in the order the function was
    traced (tf.function's automatic control dependencies), which made each tower's clock wait for the
    previous tower's and so ran the towers one after another on every timed step. `anchor` (a runtime
    scalar, e.g. the global step) is copied under the caller's control dependencies, so the callback cannot be
    constant-folded or merged with another clock.
    """

    def clock():
        seconds = tf.numpy_function(_seconds, [tf.identity(anchor)], tf.float64, stateful=False)
        return tf.ensure_shape(seconds, [])  # a scalar, so an in-graph loop can carry the step's times

    if isinstance(timed, bool):
        return clock() if timed else tf.constant(0.0, tf.float64)
    return tf.cond(timed, clock, lambda: tf.constant(0.0, tf.float64))


def clocked(timed) -> bool:
    """Whether a step traced with `timed` (a bool or a bool tensor, as `now` takes) builds clock ops. A step
    traced untimed (the bool False: `SyncUpdate.step_graph`, whose bytes per device the traffic counts read)
    builds none, not even the switch, whose predicate would cross to every tower."""
    return timed is not False


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


def micro_batch_fn(task, model, jit_compile: bool = False):
    """Returns `run_micro_batch` bound to `task` and `model`, XLA-compiled per call site when `jit_compile`.

    XLA compiles for one device, so the unit it compiles is one tower's forward and backward pass (called
    under that tower's device scope); the reduction across towers and the update stay in the ordinary graph.
    """
    if not jit_compile:
        return functools.partial(run_micro_batch, task, model)

    @graphs.function(jit_compile=True)
    def compiled(trainable, non_trainable, batch, loss_scale=None):
        return run_micro_batch(task, model, trainable, non_trainable, batch, loss_scale).flat()

    def run(trainable, non_trainable, batch, loss_scale=None):
        return MicroBatchResult(*compiled(trainable, non_trainable, batch, loss_scale))

    return run


def per_weight(total: tf.Tensor, weight: tf.Tensor) -> tf.Tensor:
    """`total / weight`, 0 where nothing had weight (a batch of padding moves no weight)."""
    return tf.math.divide_no_nan(total, tf.cast(weight, total.dtype))


def first_non_finite(losses) -> tf.Tensor:
    """Index of the first non-finite loss in micro-batch order, -1 if all are finite."""
    bad = tf.logical_not(tf.math.is_finite(tf.stack(losses)))
    # A select, not a cond: both sides are a few scalar ops, and a cond's switches cost more on every step.
    return tf.where(tf.reduce_any(bad), tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int32), -1)


def all_finite(variables) -> bool:
    """Whether every floating-point variable holds only finite values (checked before a save or export)."""
    checks = [tf.reduce_all(tf.math.is_finite(v)) for v in variables if tf.as_dtype(v.dtype).is_floating]
    return bool(tf.reduce_all(tf.stack(checks))) if checks else True
