"""`train(config)`: the library entry point. Builds data, model, optimizer and update mode, then runs the loop.

Usable without flags: `train(RunConfig(...))` returns the metrics it writes to `model_dir/metrics.json`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time

import keras
import tensorflow as tf

import data
import models
from launch import cluster as cluster_lib
from trainer.loop.controller import Loop
from trainer.loop.evaluate import Evaluator
from trainer.loop.inputs import Inputs, data_settings, eval_dataset_fn, resolve_inputs, train_iterators
from trainer.outputs import attempts as attempts_lib
from trainer.outputs import banner, report, rundir
from trainer.outputs.checkpoint import Checkpointer
from trainer.outputs.export import Serving, export_saved_model
from trainer.outputs.summaries import Summaries, purge_events, variable_tags
from trainer.settings.config import RunConfig
from trainer.settings.preprocess import DataSettings
from trainer.step import modes, spread, towers
from trainer.step.modes import mode_for
from trainer.step.staleness import TowerFailed
from trainer.step.updater import Updater
from trainer.system import determinism, devices, distributed, runtime
from trainer.system import stop as stop_lib


def train(config: RunConfig, stop: stop_lib.StopRequest | None = None, cluster=None) -> dict:
    """Trains (or resumes) the run `config` describes; returns the metrics written to `metrics.json`.

    Stop signals (SIGTERM, SIGINT, SIGUSR1, SIGUSR2) are honoured after the current step: the run
    checkpoints and raises `trainer.system.stop.StopRequested`; after a time-limit warning under Slurm it has
    also requeued its job (`trainer.outputs.attempts.after_stop`).

    Args:
      config: the run.
      stop: the stop request to honour (the process-wide `trainer.system.stop.REQUEST` by default).
      cluster: a `launch.cluster.Cluster` of several tasks whose chief this process is, already connected
        (`trainer.system.distributed.connect`); None: this machine alone. `config.towers.num_tasks` is its size.

    Raises:
      trainer.system.distributed.WorkerLost: a worker task died or never started; the message names it.
    """
    stop = stop or stop_lib.REQUEST
    config = modes.settle(config)
    os.makedirs(config.loop.model_dir, exist_ok=True)
    with rundir.RunLock(config.loop.model_dir), stop.handling():
        rundir.check_resume(config, config.loop.allow_flag_changes, log=_log_line)
        rundir.record_flags(config.loop.model_dir, config.flags_text)
        attempts = attempts_lib.AttemptLog(config.loop.model_dir)
        job = cluster_lib.slurm_job(os.environ)
        try:
            return _train_attempt(config, stop, attempts, job, cluster)
        except stop_lib.StopRequested as e:
            _log_line(str(e))
            line = attempts_lib.after_stop(attempts, e, job, config.loop.max_requeues, config.loop.train_steps)
            _log_line(line)
            raise
        except (stop_lib.Diverged, stop_lib.NoSpace) as e:
            attempts.end(f"{'diverged' if isinstance(e, stop_lib.Diverged) else 'failed'}: {e}")
            raise
        except BaseException as e:
            lost = distributed.explain(e, cluster) if cluster is not None else None
            attempts.end(f"failed: {type(lost or e).__name__}: {lost or e}"[:500])
            if lost is not None:
                raise lost from e
            raise


def _train_attempt(config: RunConfig, stop, attempts: attempts_lib.AttemptLog, job, cluster) -> dict:
    """One attempt: build, resume, train, evaluate, export, write metrics.json; with several tasks, a watchdog
    ends the process when a worker stops answering."""
    _raise_if_stopped(stop, "before the model was built")
    watchdog = contextlib.nullcontext()
    if cluster is not None and cluster.num_tasks > 1:
        watchdog = distributed.Watchdog(cluster, on_lost=lambda message: attempts.end(f"failed: {message}"))
    with watchdog:
        return _build_and_train(config, stop, attempts, job)


def _build_and_train(config: RunConfig, stop, attempts: attempts_lib.AttemptLog, job) -> dict:
    started = time.monotonic()
    state = build(config)
    _raise_if_stopped(stop, "before training started")
    restored = state.checkpointer.restore_latest()
    if restored:
        for stream in state.iterators:
            stream.restart()  # at the restored position
    step = int(state.global_step.numpy())
    where = f"resumed from {restored} at step {step}" if restored else "fresh start at step 0"
    for line in banner.start_lines(config, state):
        _log_line(line)
    finished = report.finished_metrics(config.loop.model_dir, config.loop.train_steps, step, state.model, _log_line)
    if finished is not None:
        _log_line(f"already complete: step {step} of --train_steps={config.loop.train_steps}; nothing to do")
        return finished
    attempt = attempts.begin(step, job)
    _log_line(_start_line(attempt, job, where))
    dropped = purge_events(config.loop.model_dir, attempt.resumed_from_step)
    if dropped:
        _log_line(f"TensorBoard: dropped {dropped} events written after step {attempt.resumed_from_step}")
    results = _run_loop(config, state, attempts, stop)
    export_dir = None
    if config.loop.export:
        step = results["global_step"]
        _require_finite(state.model, step, "exporting")
        serving = Serving(state.inputs.train, state.inputs.num_classes, state.data_settings.preprocess)
        export_saved_model(state.model, config, serving, step, _log_line)  # None: kept an existing one
        export_dir = os.path.join(config.loop.model_dir, "export", str(step))
    attempts.end("finished")
    metrics = report.final_metrics(config, state, results, attempts.examples_per_sec(), attempts.summary())
    report.write_json(os.path.join(config.loop.model_dir, "metrics.json"), metrics)
    for line in banner.end_lines(config, metrics, time.monotonic() - started, export_dir):
        _log_line(line)
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
    placement = state.placement
    summaries = Summaries(config.loop.model_dir, [placement.tower_tag(i) for i in range(len(placement.towers))])
    summaries.hparams(config)
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


def _start_line(attempt: attempts_lib.Attempt, job, where: str) -> str:
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
    mode: Updater  # the update mode's stepper (`trainer.step.modes`)
    evaluator: Evaluator
    checkpointer: Checkpointer
    inputs: Inputs | None = None
    bad_records: data.BadRecords | None = None  # `.count`: corrupt training records skipped so far
    data_settings: DataSettings | None = None  # augmentation, normalization and cache, resolved


def build(config: RunConfig, train_dataset: tf.data.Dataset | None = None) -> Trainer:
    """Validates `config` and builds devices, data, model, optimizer and update mode, without training.

    Args:
      config: the run.
      train_dataset: replaces the TFRecord training input (e.g. the same data held in memory, for
        benchmarks). It must yield micro-batches: every input stream (one per micro-batch index in sync mode,
        one per tower in async mode) iterates it on its own.

    Raises:
      ConfigError, data.DataError, models.ModelError: bad flags, data or model, with a message that says
        what to change.
    """
    config = modes.settle(config)
    runtime.apply(config.runtime, config.deterministic)  # threads and GPU memory: before the devices initialise
    placement = devices.resolve(config.towers)
    determinism.configure(config.seed, config.deterministic)
    runtime.apply_grappler(config.runtime)  # after determinism's arithmetic_optimization
    inputs = resolve_inputs(config.data)
    # Every eval record once (CRCs, keys, labels; not the image decode, 8x slower): a bad eval file fails
    # now, not after training. 0.3 s for 50,000 32x32 records on 2 cores.
    data.check_records(inputs.eval, inputs.num_classes, what="--eval_data")
    bad_records = data.BadRecords(config.data.max_bad_records)
    settings = data_settings(config, inputs)
    model, optimizer, global_step = build_model_and_optimizer(config, placement, inputs)
    iterators = train_iterators(config, placement, inputs, train_dataset, bad_records, settings)
    evaluator = _make_evaluator(config, model, placement, inputs, bad_records, settings)
    mode = mode_for(config.towers.update_mode).build(model, optimizer, placement, global_step, iterators, config)
    positions = {f"input_position_{i}": it.position for i, it in enumerate(iterators)}
    checkpointer = Checkpointer(
        config.loop.model_dir,
        config.loop.keep_checkpoints,
        global_step,
        log=_log_line,
        model=model,
        optimizer=optimizer,
        bad_records=bad_records.table,  # so the count, and the records already skipped, survive a resume
        **positions,
    )
    return Trainer(
        config,
        placement,
        model,
        optimizer,
        global_step,
        iterators,
        mode,
        evaluator,
        checkpointer,
        inputs,
        bad_records,
        settings,
    )


def _make_evaluator(config: RunConfig, model, placement: devices.Placement, inputs: Inputs, bad_records, settings):
    make_dataset = eval_dataset_fn(config, inputs, bad_records, settings.preprocess)
    return Evaluator(model, placement, make_dataset, explain=lambda e: bad_records.explain(e, False, _log_line))


def build_model_and_optimizer(config: RunConfig, placement: devices.Placement, inputs: Inputs):
    """Model, optimizer (slots built) and global step on the parameter device; with `spread_over`, each
    model variable and its slots on its owner (`trainer.step.spread`), the step and learning rate on the first
    tower's device."""
    _set_precision(config.towers.mixed_precision)
    with tf.device(placement.parameter_device):
        model = _build_placed_model(config, placement, inputs)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        optimizer = mode_for(config.towers.update_mode).make_optimizer(config, global_step)
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


_POLICIES = {"": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def _set_precision(mixed_precision: str) -> None:
    """Sets Keras's global dtype policy for the model about to be built (compute in bf16/fp16, variables in
    float32). The policy is process-wide, so every run sets it, float32 included."""
    keras.mixed_precision.set_global_policy(_POLICIES[mixed_precision])


def _log_line(text: str) -> None:
    print(text, flush=True)
