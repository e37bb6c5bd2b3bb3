"""How a sync step runs its K micro-batches on the towers: whole (`TowerRunner`: micro-batch j on tower
j*N//K) or through pipeline stages (`trainer.step.pipeline.runner.PipelineRunner`). `make_runner` is the one place
that chooses; both give `towers.MicroBatchResult`s in micro-batch order, which the fixed tree combines.
`inference` is the same choice for eval: the whole model on a tower, or its stages on their devices."""

from __future__ import annotations

import tensorflow as tf

from models import sharded
from trainer.settings.config import Pipeline
from trainer.step.core import micro_batch as mb
from trainer.step.memory import device_memory
from trainer.step.pipeline import runner
from trainer.step.pipeline.cut import cut_of
from trainer.system.devices import tower_of_micro_batch


class TowerRunner:
    """Each micro-batch forward and backward on one tower, with its task's copy of the values."""

    def __init__(self, task, model, towers, layout, num_micro_batches: int, jit_compile: bool, groups=None):
        self.towers, self.layout, self.num_micro_batches = towers, layout, num_micro_batches
        self.groups = groups or [(tower,) for tower in towers]  # each tower's devices (--tensor_parallel)
        self.micro_batch = mb.micro_batch_fn(task, model, jit_compile)
        self._seed_flags = [mb.is_seed_state(v) for v in model.non_trainable_variables]

    def run(self, batches, trainable, non_trainable, step, timed, loss_scale=None):
        """Returns the results in micro-batch order and {"tower_step_sec": each tower's wall time, first input
        ready -> last gradient computed, measured with in-graph timestamps when `timed` (a bool tensor or a
        bool, `mb.now`), else 0}; {} when `timed` is the bool False (no clock ops, `mb.clocked`)."""
        num_towers, clocked = len(self.towers), mb.clocked(timed)
        results, starts, ends = [], {}, {}
        for j in range(self.num_micro_batches):
            tower = tower_of_micro_batch(j, self.num_micro_batches, num_towers)
            with tf.device(self.towers[tower]), sharded.placed(self.groups[tower]):
                if clocked and tower not in starts:
                    with tf.control_dependencies(tf.nest.flatten(batches[j])):
                        starts[tower] = mb.now(step, timed)
                with tf.control_dependencies([starts[tower]] if clocked else []), tf.name_scope(f"micro_batch{j}"):
                    task = self.layout.task_of_micro_batch(j)
                    state = mb.micro_batch_seeds(non_trainable[task], self._seed_flags, step, j, self.num_micro_batches)
                    result = self.micro_batch(trainable[task], state, batches[j], loss_scale)
                results.append(result)
                if clocked:
                    with tf.control_dependencies(result.grads):
                        ends[tower] = mb.now(step, timed)
        if not clocked:
            return results, {}
        return results, {"tower_step_sec": tf.stack([ends[i] - starts[i] for i in range(num_towers)])}

    def no_timings(self) -> dict:
        """`run`'s timings before any step: what an in-graph loop carries until its timed step."""
        return {"tower_step_sec": tf.zeros([len(self.towers)], tf.float64)}

    def wrap_micro_batch(self, wrap) -> None:
        """See `Updater.wrap_micro_batch`."""
        self.micro_batch = wrap(self.micro_batch)

    def run_metrics(self, timings: dict) -> dict:
        """What `metrics.json` adds for this runner: nothing."""
        return {}

    def memory_plan(self) -> list[device_memory.Plan]:
        """Per tower, for `trainer.step.memory.device_memory`: what one of its micro-batches' gradient ops read from its
        forward, times the micro-batches alive there at once (not ordered on a tower, so all of them)."""
        per_tower = self.num_micro_batches // len(self.towers)
        split = len(self.groups[0]) > 1  # a tower's micro-batch spans its devices: each counts what it holds
        return [
            device_memory.Plan(device, per_tower, device_memory.Held.by_gradient(f"micro_batch{t * per_tower}", split))
            for t, group in enumerate(self.groups)
            for device in group
        ]


def make_runner(task, model, placement, layout, num_micro_batches: int, jit_compile: bool, plan: Pipeline):
    """The runner of a sync step: `PipelineRunner` over `plan`'s stages, or `TowerRunner` for 1; either runs each
    tower's part over the tower's devices (`placement.group`: one, or T with --tensor_parallel)."""
    towers = placement.towers
    groups = [placement.group(i) for i in range(len(towers))]
    if plan.stages == 1:
        return TowerRunner(task, model, towers, layout, num_micro_batches, jit_compile, groups)
    cut = cut_of(model, plan)
    return runner.PipelineRunner(task, model, towers, cut, plan.schedule, layout, num_micro_batches, plan.remat, groups)


def inference(model, placement, plan: Pipeline):
    """`forward(tower, inputs) -> outputs` of the model in inference mode on tower `tower`'s part of an eval
    batch: the whole model on that tower, or, with stages, each stage of the pipeline the part goes to on its
    own device (a model too large for one device is evaluated where it trains), each over its tower's devices
    (--tensor_parallel). Part i of N goes to pipeline i*P//N, as micro-batches do; the same ops either way, so
    the same outputs."""
    towers = placement.towers
    if plan.stages == 1:

        def whole(tower: int, inputs):
            with tf.device(towers[tower]), sharded.placed(placement.group(tower)):
                return model(inputs, training=False)

        return whole
    cut = cut_of(model, plan)
    num_pipelines = len(towers) // plan.stages

    def staged(tower: int, inputs):
        first = tower_of_micro_batch(tower, len(towers), num_pipelines) * plan.stages
        for s, stage in enumerate(cut):
            with tf.device(towers[first + s]), sharded.placed(placement.group(first + s)):
                inputs = stage.call(inputs, training=False)
        return inputs

    return staged
