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
import models
from trainer.loop.evaluate import Evaluator
from trainer.loop.inputs import Inputs, eval_dataset_fn, resolve_inputs, train_iterators
from trainer.outputs.checkpoint import Checkpointer
from trainer.settings.config import RunConfig
from trainer.settings.preprocess import DataSettings, data_settings
from trainer.step import footprint, mirrors, modes, optim, spread
from trainer.step.modes import Plan
from trainer.step.updater import Updater
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
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    global_step: tf.Variable
    iterators: list
    updater: Updater  # the update mode's stepper (`trainer.step.modes`)
    evaluator: Evaluator
    checkpointer: Checkpointer
    inputs: Inputs | None = None
    bad_records: data.BadRecords | None = None  # `.count`: corrupt training records skipped so far
    data_settings: DataSettings | None = None  # augmentation, normalization and cache, resolved

    @property
    def config(self) -> RunConfig:
        """The settled settings (`plan.config`)."""
        return self.plan.config


def build(run: RunConfig | Plan, train_dataset: tf.data.Dataset | None = None) -> Trainer:
    """Builds devices, data, model, optimizer and update mode, without training.

    Args:
      run: the run: a settled `Plan` (used as it is), or a `RunConfig`, settled here (`modes.planned`).
      train_dataset: replaces the TFRecord training input (e.g. the same data held in memory, for
        benchmarks). It must yield micro-batches: every input stream (one per micro-batch index in sync mode,
        one per tower in async mode) iterates it on its own.

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
    inputs = resolve_inputs(config.data)
    # Every eval record once (CRCs, keys, labels; not the image decode, 8x slower): a bad eval file fails
    # now, not after training. 0.3 s for 50,000 32x32 records on 2 cores.
    data.check_records(inputs.eval, inputs.num_classes, what="--eval_data")
    bad_records = data.BadRecords(config.data.max_bad_records)
    settings = data_settings(config, inputs.train)
    model, optimizer, global_step = build_model_and_optimizer(plan, placement, inputs)
    footprint.check_batch_fits(model, config, inputs.train.example_shape)  # before the pipeline and the graph
    iterators = train_iterators(plan, placement, inputs, train_dataset, bad_records, settings)
    evaluator = _make_evaluator(config, model, placement, inputs, bad_records, settings)
    updater = plan.mode.build(model, optimizer, placement, global_step, iterators, config)
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
    return Trainer(plan, placement, *parts, inputs, bad_records, settings)


def _make_evaluator(config: RunConfig, model, placement: devices.Placement, inputs: Inputs, bad_records, settings):
    make_dataset = eval_dataset_fn(config, inputs, bad_records, settings.preprocess)
    return Evaluator(model, placement, make_dataset, explain=lambda e: bad_records.explain(e, False, log_line))


def build_model_and_optimizer(run: RunConfig | Plan, placement: devices.Placement, inputs: Inputs):
    """Model, optimizer (slots built; the update mode's, `UpdateMode.make_optimizer`) and global step on the
    parameter device; with `spread_over`, each model variable and its slots on its owner
    (`trainer.step.spread`), the step and learning rate on the first tower's device. `run` as in `build`."""
    plan = modes.planned(run)
    config = plan.config
    _set_precision(config.towers.mixed_precision)
    with tf.device(placement.parameter_device):
        model = _build_placed_model(config, placement, inputs)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        optimizer = plan.mode.make_optimizer(config, global_step)
        optimizer = optim.with_precision(optimizer, config.towers.mixed_precision)
        optimizer.build(model.trainable_variables)  # Keras colocates each slot with its variable
    return model, optimizer, global_step


def _build_placed_model(config: RunConfig, placement: devices.Placement, inputs: Inputs):
    def build_fn():
        return models.build_model(config.model.name, inputs.train.example_shape, inputs.num_classes)

    if not placement.spread_over:
        return build_fn()
    loss_scaled = optim.loss_scaled(config.towers.mixed_precision)

    def later(model):  # the variables that will be mirrored are assigned after the others (`spread.assign`)
        return mirrors.flags(model, placement.num_tasks, placement.spread_over, loss_scaled)

    reseed = lambda: keras.utils.set_random_seed(config.seed)  # noqa: E731
    return spread.build_spread(build_fn, placement.spread_over, reseed, later)


_POLICIES = {"": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def _set_precision(mixed_precision: str) -> None:
    """Sets Keras's global dtype policy for the model about to be built (compute in bf16/fp16, variables in
    float32). The policy is process-wide, so every run sets it, float32 included."""
    keras.mixed_precision.set_global_policy(_POLICIES[mixed_precision])
