"""`build(plan)`: everything a run is made of (devices, data, model, optimizer, update mode, evaluator,
checkpointer), built and ready to step. `trainer.loop.run.train` builds with it; benchmarks and tests use it
alone, with a raw `RunConfig` (settled here, once) or a settled `trainer.step.modes.Plan`.

It makes the two decisions that need TensorFlow or the records, once each, and carries them in the `Trainer`:
the placement (`trainer.system.devices.place`) and the data settings
(`trainer.settings.preprocess.data_settings`)."""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

import data
import tasks
from models import layout, sharded, stages
from trainer.loop import padding
from trainer.loop.evaluate import Evaluator
from trainer.loop.inputs import Inputs, eval_dataset_fn, train_iterators
from trainer.loop.records import reader_for
from trainer.outputs.checkpoint import Checkpointer
from trainer.settings.config import ConfigError, RunConfig
from trainer.settings.preprocess import DataSettings
from trainer.step import modes
from trainer.step.core import micro_batch as towers
from trainer.step.core import spread
from trainer.step.memory import device_memory as stepmemory
from trainer.step.modes import Plan
from trainer.step.stepper import Updater
from trainer.step.sync import runners
from trainer.step.transfers import mirrors
from trainer.step.update import optimizers as optim
from trainer.system import determinism, devices, runtime


def log_line(text: str) -> None:
    """One line of the run's console output."""
    print(text, flush=True)


@dataclasses.dataclass
class Trainer:
    """Everything a run is made of, built and ready to step (see `build`), with the decisions it was built on:
    `plan` (settings, update mode, task count), `placement` and `data_settings`."""

    plan: Plan
    placement: devices.Placement
    task: tasks.Task
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    global_step: tf.Variable
    iterators: list
    updater: Updater  # the update mode's stepper (`trainer.step.modes`)
    evaluator: Evaluator
    checkpointer: Checkpointer
    inputs: Inputs | None = None
    reader: object = None  # how the task's records are read (`trainer.loop.records`)
    bad_records: data.BadRecords | None = None  # `.count`: corrupt training records skipped so far
    data_settings: DataSettings | None = None  # augmentation, normalization and cache, resolved

    @property
    def config(self) -> RunConfig:
        """The settled settings (`plan.config`)."""
        return self.plan.config


def build(run: RunConfig | Plan, train_dataset: tf.data.Dataset | None = None, task: tasks.Task | None = None):
    """Builds devices, data, model, optimizer and update mode, without training.

    Args:
      run: the run: a settled `Plan` (used as it is), or a `RunConfig`, settled here (`modes.planned`).
      train_dataset: replaces the TFRecord training input (e.g. the same data held in memory, for
        benchmarks). It must yield micro-batches: every input stream (one per micro-batch index in sync mode,
        one per tower in async mode) iterates it on its own.
      task: the run's task, when the caller made it already (`trainer.loop.run.train`); else made here.

    Raises:
      ConfigError, data.DataError, models.ModelError: bad flags, data or model, with a message that says
        what to change.
    """
    plan = modes.planned(run)
    config = plan.config
    runtime.apply(config.runtime, config.deterministic)  # threads and GPU memory: before the devices initialise
    placement = devices.place(config.towers)
    determinism.configure(config.seed, config.deterministic)
    runtime.apply_grappler(config.runtime)  # after determinism's arithmetic_optimization
    task = task or tasks.make_task(config)
    reader = reader_for(task, config)
    inputs = reader.resolve()
    eval_records = reader.check_eval(inputs)  # a bad eval file fails now, not after training
    bad_records = data.BadRecords(config.data.max_bad_records)
    settings = reader.data_settings(inputs)
    model, optimizer, global_step = build_model_and_optimizer(plan, placement, task)
    reader.check_fits(model, inputs)  # before the pipeline and the graph
    if config.loop.export:  # a task with nothing to serve is refused now, not after training
        reader.serving(inputs, settings).check(model)
    iterators = train_iterators(plan, placement, reader, inputs, train_dataset, bad_records, settings)
    # One example, eagerly, before any step traces: a task whose pieces do not fit is one line, not a traceback.
    towers.check_task(task, model, iterators[0].element_spec, reader.padded_length)
    padding.check_padding(task, model, reader, inputs)  # a model that looks at its padding: one warning line
    make_eval = eval_dataset_fn(config, reader, inputs, bad_records, settings)
    forward = runners.inference(model, placement, config.towers.pipeline)  # whole, or through the stages
    explain = lambda e: bad_records.explain(e, False, log_line) or reader.explain_failure(e, "--eval_data")  # noqa: E731
    evaluator = Evaluator(
        task, model, placement, make_eval, explain, forward, config.towers.num_micro_batches, num_examples=eval_records
    )
    updater = plan.mode.build(task, model, optimizer, placement, global_step, iterators, config)
    if config.runtime.device_memory_mb:  # traces the step: before the first one runs, a step too large is one line
        stepmemory.check(stepmemory.needs(updater, optimizer, reader.longest_length), config.runtime.device_memory_mb)
    positions = {f"input_position_{i}": it.position for i, it in enumerate(iterators)}
    checkpointer = Checkpointer(
        config.loop.model_dir,
        config.loop.keep_checkpoints,
        global_step,
        log=log_line,
        model=model,
        optimizer=optimizer,
        bad_records=bad_records.table,  # so the count, and the records already skipped, survive a resume
        **positions,
    )
    parts = (model, optimizer, global_step, iterators, updater, evaluator, checkpointer)
    return Trainer(plan, placement, task, *parts, inputs, reader, bad_records, settings)


def build_model_and_optimizer(run: RunConfig | Plan, placement: devices.Placement, task: tasks.Task):
    """Model, optimizer (slots built; the update mode's, `UpdateMode.make_optimizer`) and global step on the
    parameter device; with `spread_over`, each model variable and its slots on its owner
    (`trainer.step.core.spread`), the step and learning rate on the first tower's device. `run` as in `build`."""
    plan = modes.planned(run)
    config = plan.config
    _set_precision(config.towers.mixed_precision)
    with tf.device(placement.parameter_device):
        model = _build_placed_model(config, placement, task)
        _check_shards(model, config.towers.tensor)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        optimizer = plan.mode.make_optimizer(config, global_step)
        optimizer = optim.with_precision(optimizer, config.towers.mixed_precision)
        optimizer.build(model.trainable_variables)  # Keras colocates each slot with its variable
    return model, optimizer, global_step


def _build_placed_model(config: RunConfig, placement: devices.Placement, task: tasks.Task):
    """The task's model with its variables where they live: all on the parameter device; spread, each on its
    owner; with pipeline stages, each on its stage's device of the first pipeline; with tensor-parallel towers,
    each shard's on its device of the (stage's) tower, the rest on the tower's first device."""
    plan, split = config.towers.pipeline, config.towers.tensor

    build_fn = lambda: layout.split_model(task.build_model(), split.layout, split.shards, split.shards_named)  # noqa: E731
    reseed = lambda: keras.utils.set_random_seed(config.seed)  # noqa: E731
    if plan.stages > 1 or split.parallel > 1:
        owners_of = lambda model: _stage_and_shard_owners(model, plan, split)  # noqa: E731
        owned = [device for tower in range(plan.stages) for device in placement.group(tower)]
        return spread.build_spread(build_fn, owned, reseed, owners_of=owners_of)
    if not placement.spread_over:
        return build_fn()
    loss_scaled = optim.loss_scaled(config.towers.mixed_precision)

    def later(model):  # the variables that will be mirrored are assigned after the others (`spread.assign`)
        return mirrors.flags(model, placement.num_tasks, placement.spread_over, loss_scaled)

    return spread.build_spread(build_fn, placement.spread_over, reseed, later)


def _check_shards(model, split) -> None:
    """Raises ConfigError when --tensor_shards (or T without it) asks for shards the model does not have."""
    if sharded.shard_count(model) != split.shards:
        raise ConfigError(
            f"{split.shards_named} needs a model whose layers are split into {split.shards} shards; model "
            f"{model.name!r} has {sharded.shard_count(model)} "
            "(give --tensor_layout a plan naming the layers to split: its Dense layers by column or row, its "
            "attention by heads; docs/tensor_parallel.md)"
        )


def _stage_and_shard_owners(model, plan, split) -> list[int]:
    """Per variable of `model`, its index among the first pipeline's devices, T per stage: its stage's tower,
    and within it its shard's device (k*T//N; not a shard: the first)."""
    stage_of = stages.variable_stages(model, plan.stages, plan.cuts) if plan.stages > 1 else [0] * len(model.variables)
    shard_of = sharded.shard_of_variables(model)
    t, n = split.parallel, split.shards
    return [stage * t + shard_of.get(id(v), 0) * t // n for v, stage in zip(model.variables, stage_of, strict=True)]


_POLICIES = {"": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def _set_precision(mixed_precision: str) -> None:
    """Sets Keras's global dtype policy for the model about to be built (compute in bf16/fp16, variables in
    float32). The policy is process-wide, so every run sets it, float32 included."""
    keras.mixed_precision.set_global_policy(_POLICIES[mixed_precision])
