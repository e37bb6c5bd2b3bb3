"""One micro-batch's events on one pipeline stage (`trainer.step.pipeline.runner`): what its forward and its
backward run, wait for, and leave in the micro-batch's `Flow` for the next event; and the micro-batch's
`MicroBatchResult` once every stage has run it backward."""

from __future__ import annotations

import dataclasses
import functools

import tensorflow as tf

from trainer.step.core import micro_batch as mb


@dataclasses.dataclass
class Flow:
    """One micro-batch's state between its events."""

    batch: object
    task: int
    state: list  # its non-trainable values (seeds keyed on the micro-batch)
    kept: list  # per stage: what its forward kept for its backward (`stage_pass`)
    outputs: list  # per stage: its forward's outputs
    grads: dict  # variable index -> gradient
    new_state: dict  # non-trainable index -> new value
    scale: tf.Tensor | None = None  # fp16: the loss scale (`micro_batch.run_micro_batch`), else None
    upstream: list | None = None  # the gradient of the last stage run backward's float inputs
    loss: tf.Tensor | None = None
    weight: tf.Tensor | None = None
    metrics: dict | None = None


class StageEvents:
    """The events of a pipeline's stages (call them while the step traces).

    Args:
      task, model: the run's task and its model.
      calls: per stage, its `trainer.step.pipeline.stage_pass.StageCall`.
      ways: per stage, how it keeps what its backward needs (`stage_pass.way_for`).
    """

    def __init__(self, task, model, calls: list, ways: list):
        self.task, self.model, self.calls, self.ways = task, model, calls, ways
        self.num_stages = len(calls)

    def awaited(self, stage: int, kind: str, flow: Flow) -> list:
        """What an event waits for besides its device: its inputs from the stage before (forward) or their
        gradient from the stage after (backward); its clock starts when they are there."""
        if kind == "F":
            return tf.nest.flatten(flow.batch if stage == 0 else flow.outputs[stage - 1])
        return [g for g in flow.upstream if g is not None] if stage < self.num_stages - 1 else []

    def forward(self, stage: int, flow: Flow, trainable: list):
        inputs = self.task.model_inputs(flow.batch) if stage == 0 else flow.outputs[stage - 1]
        run, sources = self._bind(stage, flow, trainable)
        result, flow.kept[stage] = self.ways[stage].forward(run, sources, inputs)
        call = self.calls[stage]
        for i, value in zip(call.non_trainable, result.new_state, strict=True):
            flow.new_state[i] = value
        if call.last:
            flow.loss, flow.weight = result.loss, result.weight
            flow.metrics = mb.task_metrics(self.task, result.predictions, flow.batch)
        flow.outputs[stage] = result.outputs
        return tf.nest.flatten(result.outputs) + result.new_state

    def backward(self, stage: int, flow: Flow, trainable: list):
        run, sources = self._bind(stage, flow, trainable)
        tape, result, inputs = self.ways[stage].backward(run, sources, flow.kept[stage])
        if self.calls[stage].last:
            targets, upstream = [result.outputs], None
        else:
            leaves = [x for x in tf.nest.flatten(result.outputs) if x.dtype.is_floating]
            pairs = [(x, g) for x, g in zip(leaves, flow.upstream, strict=True) if g is not None]
            if result.reg is not None:
                pairs.append((result.reg, reg_gradient(flow)))
            targets, upstream = [x for x, _ in pairs], [g for _, g in pairs]
        grads = tape.gradient(targets, sources(inputs), output_gradients=upstream)
        flow.kept[stage] = flow.outputs[stage] = None  # activations may go
        dense = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        trainable_indices = self.calls[stage].trainable
        for i, g in zip(trainable_indices, dense[: len(trainable_indices)], strict=True):
            flow.grads[i] = g if flow.scale is None else g * tf.cast(flow.weight, g.dtype)  # as a tower's
        flow.upstream = dense[len(trainable_indices) :]
        return [g for g in dense if g is not None]

    def _bind(self, stage: int, flow: Flow, trainable: list):
        """(inputs -> the stage's `stage_pass.Pass` on this micro-batch, inputs -> what it differentiates against)."""
        call = self.calls[stage]
        values = [trainable[i] for i in call.trainable]
        run = functools.partial(call.run, batch=flow.batch, values=values, state=flow.state, scale=flow.scale)
        return run, functools.partial(call.sources, values)

    def result(self, flow: Flow) -> mb.MicroBatchResult:
        grads = [flow.grads[i] for i in range(len(self.model.trainable_variables))]
        state = [flow.new_state[i] for i in range(len(self.model.non_trainable_variables))]
        return mb.MicroBatchResult(flow.loss, flow.weight, flow.metrics, grads, state)


def reg_gradient(flow: Flow):
    """The gradient the whole model's tape gives an earlier stage's regularisation sum: d(weight * reg)/d(reg) =
    weight; with fp16's scale, through `per_weight(...) * scale` first, the same ops in the same order."""
    if flow.scale is None:
        return flow.weight
    return tf.math.divide_no_nan(flow.scale, flow.weight) * flow.weight
