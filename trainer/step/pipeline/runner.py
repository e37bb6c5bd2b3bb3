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

import tensorflow as tf

from models import sharded
from models import stages as stages_lib
from trainer.step.core import micro_batch as mb
from trainer.step.pipeline import schedules, stage_pass
from trainer.step.pipeline.clock import Clock, bubble_of
from trainer.step.pipeline.stage_events import Flow, StageEvents


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
      groups: each tower's devices, its layers split over them (--tensor_parallel); None: each tower alone.
    """

    def __init__(
        self, task, model, towers, stages, schedule: str, layout, num_micro_batches: int, remat=False, groups=None
    ):
        self.groups = groups or [(tower,) for tower in towers]
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
        self.events = StageEvents(task, model, self.calls, self.ways)
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

    def no_timings(self) -> dict:
        """`run`'s timings before any step: what an in-graph loop carries until its timed step."""
        return {
            "tower_step_sec": tf.zeros([len(self.towers)], tf.float64),
            "event_sec": tf.zeros([len(self.event_names), 2], tf.float64),
        }

    def memory_plan(self) -> list:
        """A `stepmemory.Plan` per stage device: what each micro-batch in flight there keeps (the stage's way
        says what, read off its first micro-batch's events), and how many the schedule keeps at once."""
        per_pipeline = self.num_micro_batches // self.num_pipelines
        plans = []
        for p in range(self.num_pipelines):
            for s, way in enumerate(self.ways):
                scope = f"pipeline{p}_stage{s}_{{}}{p * per_pipeline}"
                group = self.groups[p * self.num_stages + s]
                for device in group:
                    plans.append(
                        way.memory(device, scope.format("F"), scope.format("B"), self.in_flight[s], len(group) > 1)
                    )
        return plans

    def wrap_micro_batch(self, wrap) -> None:
        """A micro-batch is not one call here: the seam is the tower runner's."""
        raise NotImplementedError("wrap_micro_batch: not available with --pipeline_stages")

    def device(self, pipeline: int, stage: int) -> str:
        return self.towers[pipeline * self.num_stages + stage]

    def run(self, batches, trainable, non_trainable, step, timed, loss_scale=None):
        """Every micro-batch's forward and backward through its pipeline, in the schedule's order per device.

        Args:
          batches: the K micro-batches; trainable, non_trainable: per task, the variables' values.
          step: the global step (the seeds); timed: whether to measure each device's time (a bool, or a bool
            tensor: `mb.now`).
          loss_scale: fp16's loss scale (see `towers.run_micro_batch`), or None.

        Returns:
          (a `towers.MicroBatchResult` per micro-batch, in order; {"tower_step_sec": per tower, its first event's
          start to its last event's end; "event_sec": [start, end] of each event, named by `event_names`}, 0s
          when `timed` is a false tensor, {} when it is the bool False).
        """
        per_pipeline = self.num_micro_batches // self.num_pipelines
        flows = []
        for j, batch in enumerate(batches):
            task = self.layout.task_of_micro_batch(j)
            state = mb.micro_batch_seeds(non_trainable[task], self._seed_flags, step, j, self.num_micro_batches)
            s = self.num_stages
            flows.append(Flow(batch, task, state, [None] * s, [None] * s, {}, {}, loss_scale))
        last_op, clock = {}, Clock(timed, step)
        for pipeline in range(self.num_pipelines):
            for stage, (kind, local) in self.order:
                j = pipeline * per_pipeline + local
                device = self.device(pipeline, stage)
                group = self.groups[pipeline * self.num_stages + stage]
                with (
                    tf.device(device),
                    sharded.placed(group),
                    tf.name_scope(f"pipeline{pipeline}_stage{stage}_{kind}{j}"),
                ):
                    waits = [last_op[device]] if device in last_op else []
                    start = clock.start(device, waits + self.events.awaited(stage, kind, flows[j]))
                    with tf.control_dependencies(waits + ([start] if clock.clocked else [])):
                        run = self.events.forward if kind == "F" else self.events.backward
                        last_op[device] = tf.group(*run(stage, flows[j], trainable[flows[j].task]), name="done")
                    clock.end(device, last_op[device])
        return [self.events.result(flow) for flow in flows], clock.totals(self.towers)


def _indices_by_stage(variables, owner: dict, num_stages: int) -> list[list[int]]:
    """Per stage, the indices in `variables` of those it owns (`owner`: id -> stage)."""
    return [[i for i, v in enumerate(variables) if owner[id(v)] == s] for s in range(num_stages)]
