"""Pipeline stages (`--pipeline_stages=S`): each micro-batch flows through S stages, each on its own device.

The N towers of a machine form N/S pipelines of S consecutive devices (pipeline p, stage s: tower p*S + s);
micro-batch j runs on pipeline j*P//K, as it would on tower j*N//K without stages, on the same task. A stage
runs its part of the model (`models.stages`) under a `keras.StatelessScope` holding its variables' values,
inside a GradientTape of its own (`trainer.step.pipeline.stage_pass`: the forward's, or with `--pipeline_remat` one the
backward records running the forward again): the forward pass sends the activations to the next stage's device,
the backward pass gets their gradient from it (`output_gradients`) and sends back the gradient of its inputs.
Every op is the op data parallel runs, on another device, so each micro-batch's gradients, losses and new
BatchNorm statistics are the same bits; they go to `combine.combine`'s fixed tree as every tower's do. The
stage's variables live on its device in the first pipeline (`trainer.loop.build`), where the tree sums their
gradients.

The order of the forward and backward passes on each device is the schedule's (`trainer.step.pipeline.schedules`),
made binding with control dependencies: each event starts after the previous event of its device ended.
"""

from __future__ import annotations

import dataclasses
import functools

import tensorflow as tf

from models import stages as stages_lib
from trainer.step.core import micro_batch as mb
from trainer.step.pipeline import schedules, stage_pass


@dataclasses.dataclass
class _Flow:
    """One micro-batch's state between its events."""

    batch: object
    task: int
    state: list  # its non-trainable values (seeds keyed on the micro-batch)
    kept: list  # per stage: what its forward kept for its backward (`stagepass`)
    outputs: list  # per stage: its forward's outputs
    grads: dict  # variable index -> gradient
    new_state: dict  # non-trainable index -> new value
    scale: tf.Tensor | None = None  # fp16: the loss scale (`towers.run_micro_batch`), else None
    upstream: list | None = None  # the gradient of the last stage run backward's float inputs
    loss: tf.Tensor | None = None
    weight: tf.Tensor | None = None
    metrics: dict | None = None


class PipelineRunner:
    """Runs a step's K micro-batches through P pipelines of S stages (see the module docstring).

    Args:
      task, model: the run's task and its model.
      towers: the run's tower devices, task-major; pipeline p is towers[p*S : (p+1)*S].
      stages: the model cut into S stages (`models.stages.cut`).
      schedule: a name in `trainer.step.pipeline.schedules.SCHEDULES`.
      layout: the run's `trainer.step.core.tree.Layout` (which task holds each micro-batch).
      remat: recompute each stage's forward in its backward instead of keeping its activations, where the
        schedule keeps more than one micro-batch in flight (`stage_pass.way_for`).
    """

    def __init__(self, task, model, towers, stages, schedule: str, layout, num_micro_batches: int, remat=False):
        self.task, self.model, self.stages, self.layout = task, model, stages, layout
        self.num_stages, self.num_micro_batches = len(stages), num_micro_batches
        self.num_pipelines = len(towers) // self.num_stages
        self.towers = towers
        self.schedule, self.remat = schedule, remat
        per_pipeline = num_micro_batches // self.num_pipelines
        self.per_stage = schedules.SCHEDULES[schedule](self.num_stages, per_pipeline)  # each stage's events
        self.order = schedules.build_order(self.per_stage)
        self.in_flight = [schedules.in_flight(events) for events in self.per_stage]
        self.ways = [stage_pass.way_for(remat, flight) for flight in self.in_flight]
        owner = stages_lib.stage_of_variables(model, stages)
        trainable = _indices_by_stage(model.trainable_variables, owner, self.num_stages)
        non_trainable = _indices_by_stage(model.non_trainable_variables, owner, self.num_stages)
        last = self.num_stages - 1
        self.calls = [
            stage_pass.StageCall(task, model, stage, stage.index == last, trainable[s], non_trainable[s])
            for s, stage in enumerate(stages)
        ]
        self._seed_flags = [mb.is_seed_state(v) for v in model.non_trainable_variables]

    @property
    def event_names(self) -> list[str]:
        """ "stage:F<j>" / "stage:B<j>" of each row of a timed step's `event_sec` ([start, end] seconds)."""
        per_pipeline = self.num_micro_batches // self.num_pipelines
        return [
            f"{stage}:{kind}{pipeline * per_pipeline + local}"
            for pipeline in range(self.num_pipelines)
            for stage, (kind, local) in self.order
        ]

    @property
    def recomputing_stages(self) -> list[int]:
        """The stages whose backward runs their forward again (`--pipeline_remat`, several micro-batches kept)."""
        return [s for s, way in enumerate(self.ways) if way.recomputes]

    def stage_variables(self, stage: int) -> list:
        """The model variables stage `stage` owns, trainable then not; they live on `device(0, stage)`."""
        call = self.calls[stage]
        trainable, other = self.model.trainable_variables, self.model.non_trainable_variables
        return [trainable[i] for i in call.trainable] + [other[i] for i in call.non_trainable]

    def run_metrics(self, timings: dict) -> dict:
        """`metrics.json`'s "pipeline": stages, schedule, each stage's pieces and device, and the bubble:
        expected, (S-1)/(m+S-1), and measured on the last timed step (`bubble`)."""
        busy, measured = bubble_of(self.event_names, timings.get("event_sec"), self.num_stages, self.num_pipelines)
        return {
            "pipeline": {
                "stages": self.num_stages,
                "pipelines": self.num_pipelines,
                "schedule": self.schedule,
                "remat": self.remat,
                "recomputing_stages": self.recomputing_stages,
                "stage_pieces": [stage.name for stage in self.stages],
                "stage_devices": [self.device(0, s) for s in range(self.num_stages)],
                "bubble_expected": schedules.bubble(self.num_stages, self.num_micro_batches // self.num_pipelines),
                "bubble_measured": measured,
                "stage_busy_sec": busy,
            }
        }

    def memory_plan(self) -> list:
        """A `stepmemory.Plan` per stage device: what each micro-batch in flight there keeps (the stage's way
        says what, read off its first micro-batch's events), and how many the schedule keeps at once."""
        per_pipeline = self.num_micro_batches // self.num_pipelines
        plans = []
        for p in range(self.num_pipelines):
            for s, way in enumerate(self.ways):
                scope = f"pipeline{p}_stage{s}_{{}}{p * per_pipeline}"
                plans.append(way.memory(self.device(p, s), scope.format("F"), scope.format("B"), self.in_flight[s]))
        return plans

    def wrap_micro_batch(self, wrap) -> None:
        """A micro-batch is not one call here: the seam is the tower runner's."""
        raise NotImplementedError("wrap_micro_batch: not available with --pipeline_stages")

    def device(self, pipeline: int, stage: int) -> str:
        return self.towers[pipeline * self.num_stages + stage]

    def run(self, batches, trainable, non_trainable, step, timed: bool, loss_scale=None):
        """Every micro-batch's forward and backward through its pipeline, in the schedule's order per device.

        Args:
          batches: the K micro-batches; trainable, non_trainable: per task, the variables' values.
          step: the global step (the seeds); timed: measure each device's time.
          loss_scale: fp16's loss scale (see `towers.run_micro_batch`), or None.

        Returns:
          (a `towers.MicroBatchResult` per micro-batch, in order; when `timed`, {"tower_step_sec": per tower, its
          first event's start to its last event's end; "event_sec": [start, end] of each event, named by
          `event_names`}, else {}).
        """
        per_pipeline = self.num_micro_batches // self.num_pipelines
        flows = []
        for j, batch in enumerate(batches):
            task = self.layout.task_of_micro_batch(j)
            state = mb.micro_batch_seeds(non_trainable[task], self._seed_flags, step, j, self.num_micro_batches)
            s = self.num_stages
            flows.append(_Flow(batch, task, state, [None] * s, [None] * s, {}, {}, loss_scale))
        last_op, clock = {}, _Clock(timed, step)
        for pipeline in range(self.num_pipelines):
            for stage, (kind, local) in self.order:
                j = pipeline * per_pipeline + local
                device = self.device(pipeline, stage)
                with tf.device(device), tf.name_scope(f"pipeline{pipeline}_stage{stage}_{kind}{j}"):
                    waits = [last_op[device]] if device in last_op else []
                    start = clock.start(device, waits + self._awaited(stage, kind, flows[j]))
                    with tf.control_dependencies(waits + ([start] if timed else [])):
                        run = self._forward if kind == "F" else self._backward
                        last_op[device] = tf.group(*run(stage, flows[j], trainable[flows[j].task]), name="done")
                    clock.end(device, last_op[device])
        return [self._result(flow) for flow in flows], clock.totals(self.towers)

    def _awaited(self, stage: int, kind: str, flow: _Flow) -> list:
        """What an event waits for besides its device: its inputs from the stage before (forward) or their
        gradient from the stage after (backward); its clock starts when they are there."""
        if kind == "F":
            return tf.nest.flatten(flow.batch if stage == 0 else flow.outputs[stage - 1])
        return [g for g in flow.upstream if g is not None] if stage < self.num_stages - 1 else []

    def _forward(self, stage: int, flow: _Flow, trainable: list):
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

    def _backward(self, stage: int, flow: _Flow, trainable: list):
        run, sources = self._bind(stage, flow, trainable)
        tape, result, inputs = self.ways[stage].backward(run, sources, flow.kept[stage])
        if self.calls[stage].last:
            targets, upstream = [result.outputs], None
        else:
            leaves = [x for x in tf.nest.flatten(result.outputs) if x.dtype.is_floating]
            pairs = [(x, g) for x, g in zip(leaves, flow.upstream, strict=True) if g is not None]
            if result.reg is not None:
                pairs.append((result.reg, _reg_gradient(flow)))
            targets, upstream = [x for x, _ in pairs], [g for _, g in pairs]
        grads = tape.gradient(targets, sources(inputs), output_gradients=upstream)
        flow.kept[stage] = flow.outputs[stage] = None  # activations may go
        dense = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        trainable_indices = self.calls[stage].trainable
        for i, g in zip(trainable_indices, dense[: len(trainable_indices)], strict=True):
            flow.grads[i] = g if flow.scale is None else g * tf.cast(flow.weight, g.dtype)  # as a tower's
        flow.upstream = dense[len(trainable_indices) :]
        return [g for g in dense if g is not None]

    def _bind(self, stage: int, flow: _Flow, trainable: list):
        """(inputs -> the stage's `stage_pass.Pass` on this micro-batch, inputs -> what it differentiates against)."""
        call = self.calls[stage]
        values = [trainable[i] for i in call.trainable]
        run = functools.partial(call.run, batch=flow.batch, values=values, state=flow.state, scale=flow.scale)
        return run, functools.partial(call.sources, values)

    def _result(self, flow: _Flow) -> mb.MicroBatchResult:
        grads = [flow.grads[i] for i in range(len(self.model.trainable_variables))]
        state = [flow.new_state[i] for i in range(len(self.model.non_trainable_variables))]
        return mb.MicroBatchResult(flow.loss, flow.weight, flow.metrics, grads, state)


def _reg_gradient(flow: _Flow):
    """The gradient the whole model's tape gives an earlier stage's regularisation sum: d(weight * reg)/d(reg) =
    weight; with fp16's scale, through `per_weight(...) * scale` first, the same ops in the same order."""
    if flow.scale is None:
        return flow.weight
    return tf.math.divide_no_nan(flow.scale, flow.weight) * flow.weight


def bubble_of(names: list[str], events, num_stages: int, num_pipelines: int):
    """(seconds each device's events ran, the measured bubble) of a timed step's `events` ([start, end] per
    event, named as `PipelineRunner.event_names`), or (None, None) without them. A device's bubble is the
    share of its pipeline's span (first start to last end of any of its stages) in which it ran nothing, an
    event counting from when its inputs were there; the measured bubble is the mean over devices.

    The clocks are host callbacks, which run late when the inter-op threads are busy: an event is cut at the
    start of the next event of its device (which a control dependency holds until it ended), so a device is
    never busy longer than its span.
    """
    if not events:
        return None, None
    per_pipeline = len(names) // num_pipelines
    by_device, spans = {}, {}
    for index, (name, (start, end)) in enumerate(zip(names, events, strict=True)):
        pipeline, stage = index // per_pipeline, int(name.split(":")[0])
        by_device.setdefault(pipeline * num_stages + stage, []).append((start, end))  # in the device's order
        lo, hi = spans.get(pipeline, (start, end))
        spans[pipeline] = (min(lo, start), max(hi, end))
    busy = {}
    for device, runs in by_device.items():
        ends = [min(end, after[0]) for (_, end), after in zip(runs, runs[1:], strict=False)] + [runs[-1][1]]
        busy[device] = sum(max(0.0, end - start) for (start, _), end in zip(runs, ends, strict=True))
    bubbles = [1.0 - busy[d] / (spans[d // num_stages][1] - spans[d // num_stages][0]) for d in sorted(busy)]
    return [busy[d] for d in sorted(busy)], sum(bubbles) / len(bubbles)


def _indices_by_stage(variables, owner: dict, num_stages: int) -> list[list[int]]:
    """Per stage, the indices in `variables` of those it owns (`owner`: id -> stage)."""
    return [[i for i, v in enumerate(variables) if owner[id(v)] == s] for s in range(num_stages)]


class _Clock:
    """In-graph timestamps of each event (only on a timed step: two host callbacks per event)."""

    def __init__(self, timed: bool, anchor):
        self.timed, self.anchor, self.first, self.last = timed, anchor, {}, {}
        self.events = []  # [start, end] of every event, in build order (`PipelineRunner.event_names`)
        self._open = None

    def start(self, device: str, waits: list):
        """The event's start: once its device is free and its inputs are there."""
        if not self.timed:
            return None
        with tf.control_dependencies(waits):
            self._open = mb.now(self.anchor)
        self.first.setdefault(device, self._open)
        return self._open

    def end(self, device: str, done) -> None:
        if not self.timed:
            return
        with tf.control_dependencies([done]):
            self.last[device] = mb.now(self.anchor)
        self.events.append(tf.stack([self._open, self.last[device]]))

    def totals(self, towers) -> dict:
        if not self.timed:
            return {}
        return {
            "tower_step_sec": tf.stack([self.last[d] - self.first[d] for d in towers]),
            "event_sec": tf.stack(self.events),
        }
