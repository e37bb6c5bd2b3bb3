"""One pipeline stage's part of one micro-batch (`trainer.step.pipeline.runner`): run its pieces forward, and in its
backward event take the gradients of its variables and of its inputs. Two ways to keep what the backward needs,
chosen once per stage by `way_for`:

- `Taped`: the forward event runs under a GradientTape that the backward event reads; every activation the
  gradient needs stays alive from the forward to the backward, for each micro-batch in flight on the stage.
- `Recomputed` (`--pipeline_remat`): the forward event runs without a tape and keeps only the stage's inputs;
  the backward event runs the forward again under its own tape and differentiates that. The recomputation reads
  the same inputs, variable values and per-micro-batch seeds under the same `keras.StatelessScope` mapping, so
  it draws the same dropout masks and BatchNorm batch statistics and gives the same bits; its ops are built
  inside the backward event, so they wait on the device's previous event as the schedule says. Costs one more
  forward per micro-batch; holds the activations of one micro-batch, during its backward.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from trainer.step.core import micro_batch as mb
from trainer.step.memory import device_memory

RECOMPUTE = "recompute"  # the name scope of a backward event's recomputed forward


@dataclasses.dataclass
class Pass:
    """What running a stage's pieces gave (`StageCall.run`)."""

    outputs: object  # to the next stage; the last stage's: its loss + weight * regularisation, a scalar
    reg: tf.Tensor | None  # an earlier stage's regularisation sum (its gradient is the weight), else None
    new_state: list  # the new values of the stage's non-trainable variables, in the stage's order
    loss: tf.Tensor | None = None  # the last stage's: the sum of loss x weight, its weight and predictions
    weight: tf.Tensor | None = None
    predictions: object = None


class StageCall:
    """Runs stage `stage.index`'s pieces on one micro-batch under a `keras.StatelessScope`.

    Args:
      task, model: the run's task and its model.
      stage: the `models.stages.Stage`; last: it is the model's last stage (it adds the task's loss).
      trainable, non_trainable: indices, in the model's variable lists, of the variables the stage owns.
    """

    def __init__(self, task, model, stage, last: bool, trainable: list[int], non_trainable: list[int]):
        self.task, self.stage, self.last = task, stage, last
        self.trainable, self.non_trainable = trainable, non_trainable
        self._trainable_vars = [model.trainable_variables[i] for i in trainable]
        self._non_trainable_vars = [model.non_trainable_variables[i] for i in non_trainable]

    def sources(self, values: list, inputs) -> list:
        """What the stage differentiates against: its variables' values and its floating-point inputs (the
        first stage's inputs are the batch, whose gradient nobody needs)."""
        floats = [x for x in tf.nest.flatten(inputs) if x.dtype.is_floating] if self.stage.index else []
        return values + floats

    def run(self, inputs, batch, values: list, state: list, scale=None) -> Pass:
        """The stage's pieces on `inputs`, its variables read as `values` (the stage's trainable values, in
        its order) and `state` (the micro-batch's non-trainable values, all of the model's); the last stage's
        total is the scaled mean with fp16's loss `scale`, as a tower differentiates it."""
        mapping = list(zip(self._trainable_vars, values, strict=True))
        mapping += [(v, state[i]) for v, i in zip(self._non_trainable_vars, self.non_trainable, strict=True)]
        with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
            outputs = self.stage.call(inputs, training=True)
            losses = [loss for layer in self.stage.layers for loss in layer.losses]
        reg = tf.add_n([tf.cast(x, tf.float32) for x in losses]) if losses else None
        new_state = [scope.get_current_value(v) for v in self._non_trainable_vars]
        if not self.last:
            return Pass(outputs, reg, new_state)
        # The task's loss, as `towers.run_micro_batch` computes it on the whole model's outputs.
        predictions = tf.nest.map_structure(mb.float32, outputs)
        loss, weight = mb.weighted_sums(self.task, predictions, batch)
        total = loss + weight * reg if reg is not None else loss
        if scale is not None:  # fp16: the mean, scaled, as `towers.run_micro_batch` differentiates
            total = mb.per_weight(total, weight) * scale
        return Pass(total, None, new_state, loss, weight, predictions)


class Taped:
    """The forward's tape, kept until the backward: every activation the gradient reads stays alive."""

    recomputes = False

    def forward(self, run, sources, inputs):
        """Runs `run(inputs)` (a `Pass`) under a tape watching `sources(inputs)`. Returns (the pass, what the
        backward needs)."""
        tape, result = _taped(run, sources, inputs)
        return result, (tape, result, inputs)

    def backward(self, run, sources, kept):
        """(the tape, the pass it recorded, the stage's inputs) to differentiate."""
        return kept

    def memory(self, device: str, forward: str, backward: str, in_flight: int, split=False) -> device_memory.Plan:
        """Each micro-batch in flight holds what the gradient ops of its forward read (`split`: those made on
        `device`, one of the stage's tensor-parallel devices)."""
        return device_memory.Plan(device, in_flight, device_memory.Held.by_gradient(forward, split))


class Recomputed:
    """Only the inputs kept; the backward runs the forward again under its own tape (rematerialisation)."""

    recomputes = True

    def forward(self, run, sources, inputs):
        """Runs `run` without a tape on the inputs, kept as identities made in the forward's name scope (which
        is how `stepmemory` tells what the forward keeps). Returns (the pass, the kept inputs)."""
        kept = tf.nest.map_structure(lambda x: tf.identity(x, name="kept"), inputs)
        return run(kept), kept

    def backward(self, run, sources, kept):
        """Runs the forward again on the kept inputs under a tape, in the name scope "recompute" (inside the
        backward event's). Returns (the tape, its pass, the inputs)."""
        with tf.name_scope(RECOMPUTE):
            tape, result = _taped(run, sources, kept)
        return tape, result, kept

    def memory(self, device: str, forward: str, backward: str, in_flight: int, split=False) -> device_memory.Plan:
        """Each micro-batch in flight holds its inputs (what the backward reads from the forward); one
        backward at a time holds what its recomputation's gradient ops read (`split`: those made on `device`)."""
        held = device_memory.Held(forward, (backward, f"gradient_tape/{backward}"), split)
        recomputed = device_memory.Held.by_gradient(f"{backward}/{RECOMPUTE}", split)  # not the tape's sums
        return device_memory.Plan(device, in_flight, held, recomputed=recomputed)


def way_for(remat: bool, in_flight: int) -> Taped | Recomputed:
    """How a stage keeps what its backward needs: recomputed with `--pipeline_remat` where the schedule keeps
    more than one micro-batch in flight. With one (the last stage under 1f1b, whose backward follows its
    forward at once) the recomputation would hold the same activations for as long, plus the inputs, and cost
    a forward: that stage keeps its tape."""
    return Recomputed() if remat and in_flight > 1 else Taped()


def _taped(run, sources, inputs):
    """(a tape watching only `sources(inputs)`, `run(inputs)` recorded on it)."""
    tape = tf.GradientTape(watch_accessed_variables=False)
    with tape:
        tape.watch(sources(inputs))
        result = run(inputs)
    return tape, result
