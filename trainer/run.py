"""`train(config)`: the library entry point. Builds data, model, optimizer and update mode, then runs the loop.

Usable without flags: `train(RunConfig(...))` returns the metrics it writes to `model_dir/metrics.json`.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import keras
import numpy as np
import tensorflow as tf

import data
import models
from launch import cluster
from trainer import attempts as attempts_lib
from trainer import determinism, devices, optim, report, rundir, spread, towers
from trainer import stop as stop_lib
from trainer.asynchronous import AsyncUpdate
from trainer.checkpoint import Checkpointer
from trainer.config import DataConfig, RunConfig, flatten, validate
from trainer.evaluate import Evaluator
from trainer.loop import Loop
from trainer.staleness import TowerFailed
from trainer.summaries import Summaries, purge_events, variable_tags
from trainer.sync import SyncUpdate

log = logging.getLogger("towerflow")


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The resolved train and eval records."""

    train: data.RecordInfo
    eval: data.RecordInfo
    num_classes: int


def resolve_inputs(config: DataConfig) -> Inputs:
    """Finds the records (building the digits cache when no --train_data is given) and reads their shape.

    Raises:
      data.DataError: no files, unreadable records, train and eval records of different shapes.
    """
    if config.train_data:
        train_pattern, eval_pattern, num_classes = config.train_data, config.eval_data, config.num_classes
    else:
        train_pattern, eval_pattern = data.ensure_digits()
        num_classes = 10
    schema = _schema(config)
    train = data.inspect_records(train_pattern, schema, what="--train_data")
    evaluation = data.inspect_records(eval_pattern, train.schema, what="--eval_data")
    if evaluation.example_shape != train.example_shape:
        raise data.DataError(
            f"--eval_data examples have shape {evaluation.example_shape} but --train_data examples have "
            f"{train.example_shape}; pass --image_size=H,W to resize both"
        )
    return Inputs(train, evaluation, num_classes)


def _schema(config: DataConfig):
    if config.record_schema == "dense":
        return data.DenseSchema(config.feature_key, config.label_key, config.label_offset)
    if config.record_schema == "image" or config.label_offset or config.image_size:
        return data.ImageSchema(config.label_offset, config.image_size)
    return None  # auto: the first record decides


def train(config: RunConfig, stop: stop_lib.StopRequest | None = None) -> dict:
    """Trains (or resumes) the run `config` describes; returns the metrics written to `metrics.json`.

    Stop signals (SIGTERM, SIGINT, SIGUSR1, SIGUSR2) are honoured after the current step: the run
    checkpoints and raises `trainer.stop.StopRequested`; after a time-limit warning under Slurm it has
    also requeued its job (`trainer.attempts.after_stop`).

    Args:
      config: the run.
      stop: the stop request to honour (the process-wide `trainer.stop.REQUEST` by default).
    """
    stop = stop or stop_lib.REQUEST
    validate(config)
    os.makedirs(config.loop.model_dir, exist_ok=True)
    with rundir.RunLock(config.loop.model_dir), stop.handling():
        rundir.check_resume(config, config.loop.allow_flag_changes, log=_log_line)
        rundir.record_flags(config.loop.model_dir, config.flags_text)
        attempts = attempts_lib.AttemptLog(config.loop.model_dir)
        job = cluster.slurm_job(os.environ)
        try:
            return _train_attempt(config, stop, attempts, job)
        except stop_lib.StopRequested as e:
            _log_line(str(e))
            line = attempts_lib.after_stop(attempts, e, job, config.loop.max_requeues, config.loop.train_steps)
            _log_line(line)
            raise
        except (stop_lib.Diverged, stop_lib.NoSpace) as e:
            attempts.end(f"{'diverged' if isinstance(e, stop_lib.Diverged) else 'failed'}: {e}")
            raise
        except BaseException as e:
            attempts.end(f"failed: {type(e).__name__}: {e}"[:500])
            raise


def _train_attempt(config: RunConfig, stop, attempts: attempts_lib.AttemptLog, job) -> dict:
    """One attempt: build, resume, train, evaluate, export, write metrics.json."""
    _raise_if_stopped(stop, "before the model was built")
    state = build(config)
    _raise_if_stopped(stop, "before training started")
    restored = state.checkpointer.restore_latest()
    attempt = attempts.begin(int(state.global_step.numpy()), job)
    _log_line(_start_line(attempt, job, restored))
    dropped = purge_events(config.loop.model_dir, attempt.resumed_from_step)
    if dropped:
        _log_line(f"TensorBoard: dropped {dropped} events written after step {attempt.resumed_from_step}")
    results = _run_loop(config, state, attempts, stop)
    if config.loop.export:
        _require_finite(state.model, results["global_step"], "exporting")
        state.model.export(os.path.join(config.loop.model_dir, "export"), verbose=False)
    attempts.end("finished")
    metrics = _final_metrics(config, state, attempts, results)
    report.write_json(os.path.join(config.loop.model_dir, "metrics.json"), metrics)
    return metrics


def _require_finite(model, step: int, doing: str) -> None:
    if not towers.all_finite(model.variables):
        raise stop_lib.Diverged(f"a weight was not finite at step {step}; not {doing} (the last checkpoint is kept)")


def _raise_if_stopped(stop: stop_lib.StopRequest, when: str) -> None:
    if stop.requested:
        message = f"stopped by {stop.describe()} {when}; nothing to save. Rerun the same command to resume."
        raise stop_lib.StopRequested(message, stop.signum, None, signalled_while_training=False)


def _run_loop(config: RunConfig, state, attempts: attempts_lib.AttemptLog, stop: stop_lib.StopRequest) -> dict:
    """Runs the loop, recording the attempt's progress at every checkpoint."""
    summaries = Summaries(config.loop.model_dir)
    summaries.hparams(hparams(config))
    trainable = state.model.trainable_variables

    def on_checkpoint(step: int) -> None:
        attempts.progress(step, *loop.throughput.totals())

    loop = Loop(
        state.mode,
        config.loop,
        state.evaluator,
        state.checkpointer,
        summaries,
        trainable,
        variable_tags(trainable),
        log=_log_line,
        stop=stop,
        on_checkpoint=on_checkpoint,
        before_save=lambda step: _require_finite(state.model, step, "saving a checkpoint"),
        extra_scalars=lambda: {"bad_records": state.bad_records.count} if state.bad_records else {},
    )
    try:
        return loop.run()
    except (tf.errors.OpError, TowerFailed) as e:  # what `next(iterator)` in a step raised for bad data
        explained = state.bad_records and state.bad_records.explain(e, training=True, log=_log_line)
        if explained is None:
            raise
        raise explained from e
    finally:
        state.mode.close()
        summaries.close()


def _start_line(attempt: attempts_lib.Attempt, job, restored: str | None) -> str:
    where = f"resumed from {restored} at step {attempt.resumed_from_step}" if restored else "fresh start at step 0"
    who = f"; {job.describe()}" if job is not None else ""
    return f"attempt {attempt.attempt} (host {attempt.host}, pid {attempt.pid}{who}): {where}"


@dataclasses.dataclass
class Trainer:
    """Everything a run is made of, built and ready to step (see `build`)."""

    config: RunConfig
    placement: devices.Placement
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    global_step: tf.Variable
    iterators: list
    mode: SyncUpdate | AsyncUpdate
    evaluator: Evaluator
    checkpointer: Checkpointer
    bad_records: data.BadRecords | None = None  # `.count`: corrupt training records skipped so far


def build(config: RunConfig, train_dataset: tf.data.Dataset | None = None) -> Trainer:
    """Validates `config` and builds devices, data, model, optimizer and update mode, without training.

    Args:
      config: the run.
      train_dataset: replaces the TFRecord training input (e.g. the same data held in memory, for
        benchmarks). It must yield global batches in sync mode, micro-batches in async mode (where every
        tower then iterates it on its own).

    Raises:
      ConfigError, data.DataError, models.ModelError: bad flags, data or model, with a message that says
        what to change.
    """
    validate(config)
    placement = devices.resolve(config.towers)
    determinism.configure(config.seed, config.deterministic)
    inputs = resolve_inputs(config.data)
    # Every eval record once (CRCs, keys, labels; not the image decode, 8x slower): a bad eval file fails
    # now, not after training. 0.3 s for 50,000 32x32 records on 2 cores.
    data.check_records(inputs.eval, inputs.num_classes, what="--eval_data")
    bad_records = data.BadRecords(config.data.max_bad_records)
    model, optimizer, global_step = build_model_and_optimizer(config, placement, inputs)
    iterators = _train_iterators(config, placement, inputs, train_dataset, bad_records)
    evaluator = _make_evaluator(config, model, placement, inputs, bad_records)
    mode = _make_mode(config, model, optimizer, placement, global_step, iterators)
    named_iterators = {f"iterator_{i}": it for i, it in enumerate(iterators)}
    checkpointer = Checkpointer(
        config.loop.model_dir,
        config.loop.keep_checkpoints,
        global_step,
        log=_log_line,
        model=model,
        optimizer=optimizer,
        bad_records=bad_records.table,  # so the count, and the records already skipped, survive a resume
        **named_iterators,
    )
    return Trainer(
        config, placement, model, optimizer, global_step, iterators, mode, evaluator, checkpointer, bad_records
    )


def _make_evaluator(config: RunConfig, model, placement: devices.Placement, inputs: Inputs, bad_records):
    eval_batch = config.data.eval_batch_size or config.towers.global_batch_size

    def make_dataset():
        return data.make_dataset(
            inputs.eval, batch_size=eval_batch, training=False, num_classes=inputs.num_classes, bad_records=bad_records
        )

    return Evaluator(model, placement, make_dataset, explain=lambda e: bad_records.explain(e, False, _log_line))


def build_model_and_optimizer(config: RunConfig, placement: devices.Placement, inputs: Inputs):
    """Model, optimizer (slots built) and global step on the parameter device; with `spread_over`, each
    model variable and its slots on its owner (`trainer.spread`), the step and learning rate on the first
    tower's device."""
    _set_precision(config.towers.mixed_precision)
    with tf.device(placement.parameter_device):
        model = _build_placed_model(config, placement, inputs)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        optimizer = _make_optimizer(config, global_step)
        if config.towers.mixed_precision == "fp16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)  # Keras colocates each slot with its variable
        spread.place_updates(optimizer)
    return model, optimizer, global_step


def _build_placed_model(config: RunConfig, placement: devices.Placement, inputs: Inputs):
    def build_fn():
        return models.build_model(config.model.name, inputs.train.example_shape, inputs.num_classes)

    if not placement.spread_over:
        return build_fn()
    return spread.build_spread(build_fn, placement.spread_over, reseed=lambda: keras.utils.set_random_seed(config.seed))


def _make_optimizer(config: RunConfig, global_step: tf.Variable):
    """Async mode scales each update's learning rate by 1/K (K updates ~ one sync step) and lowers the
    explicit momentum by what asynchrony adds (`optim.async_momentum`)."""
    t = config.towers
    if t.update_mode != "async":
        return optim.make_optimizer(config.optimizer, config.loop.train_steps, global_step)
    momentum = optim.async_momentum(config.optimizer.momentum, t.num_towers)
    if config.optimizer.name == "momentum":
        log.warning(
            "async: explicit momentum %.3g instead of %.3g (N=%d towers add implicit momentum)",
            momentum,
            config.optimizer.momentum,
            t.num_towers,
        )
    return optim.make_optimizer(
        config.optimizer, config.loop.train_steps, global_step, lr_scale=1.0 / t.num_micro_batches, momentum=momentum
    )


def _train_iterators(
    config: RunConfig, placement: devices.Placement, inputs: Inputs, train_dataset, bad_records: data.BadRecords
) -> list:
    """Sync: one iterator of global batches. Async: one per tower, each over its own share of the files,
    yielding micro-batches, so no example is read twice per epoch across towers."""
    t = config.towers
    shares = len(placement.towers) if t.update_mode == "async" else 1
    batch_size = t.micro_batch_size if t.update_mode == "async" else t.global_batch_size
    with tf.device(placement.host):
        if train_dataset is not None:
            return [iter(train_dataset) for _ in range(shares)]
        datasets = [
            data.make_dataset(
                inputs.train,
                batch_size=batch_size,
                training=True,
                seed=config.seed,
                worker_index=i,
                num_workers=shares,
                shuffle_buffer=config.data.shuffle_buffer,
                num_classes=inputs.num_classes,
                bad_records=bad_records,
            )
            for i in range(shares)
        ]
        return [iter(ds) for ds in datasets]


def _make_mode(config: RunConfig, model, optimizer, placement, global_step, iterators):
    t = config.towers
    clip = config.optimizer.clip_global_norm
    if t.update_mode == "async":
        return AsyncUpdate(
            model,
            optimizer,
            placement,
            global_step,
            iterators,
            max_staleness=t.max_staleness,
            clip_global_norm=clip,
            jit_compile=t.jit_compile,
        )
    return SyncUpdate(
        model,
        optimizer,
        placement,
        t.num_micro_batches,
        global_step,
        iterators[0],
        clip_global_norm=clip,
        jit_compile=t.jit_compile,
    )


_POLICIES = {"": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def _set_precision(mixed_precision: str) -> None:
    """Sets Keras's global dtype policy for the model about to be built (compute in bf16/fp16, variables in
    float32). The policy is process-wide, so every run sets it, float32 included."""
    keras.mixed_precision.set_global_policy(_POLICIES[mixed_precision])


def _final_metrics(config: RunConfig, state: Trainer, attempts: attempts_lib.AttemptLog, results: dict) -> dict:
    t = config.towers
    metrics = {
        "global_step": results["global_step"],
        "train_loss": results.get("train_loss"),
        "train_accuracy": results.get("train_accuracy"),
        "eval_loss": results.get("eval_loss"),
        "eval_accuracy": results.get("eval_accuracy"),
        "eval_examples": results.get("eval_examples"),
        "examples_per_sec": attempts.examples_per_sec(),  # over every attempt of the run
        "bad_records": state.bad_records.count if state.bad_records else 0,
        "attempts": attempts.summary(),
        "num_towers": t.num_towers,
        "micro_batches": t.num_micro_batches,
        "global_batch_size": t.global_batch_size,
        "update_mode": t.update_mode,
        "deterministic": config.deterministic,
        "model": config.model.name,
        "placement": t.parameter_device,
        "parameter_devices": spread.parameter_devices([*state.model.variables, *state.optimizer.variables]),
        "weights_sha256": report.weights_sha256(state.model.variables),
        "weights_order": "model.variables (Keras tracking order), raw C-order bytes of each",
    }
    staleness = getattr(state.mode, "staleness_all", None)
    if staleness:  # async: over every update of this process (a resumed run counts from its restart)
        metrics.update(
            staleness_mean=float(np.mean(staleness)),
            staleness_max=int(np.max(staleness)),
            staleness_updates=len(staleness),
            max_staleness=t.max_staleness,
        )
    return metrics


def hparams(config: RunConfig) -> dict:
    """The run's settings, flattened (`towers.num_towers`, `optimizer.learning_rate`, ...) for TensorBoard."""
    return flatten(config)


def _log_line(text: str) -> None:
    print(text, flush=True)
