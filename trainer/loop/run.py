"""`train(plan)`: the library entry point. Builds data, model, optimizer and update mode, then runs the loop.

Usable without flags: `train(RunConfig(...))` settles the settings once (`trainer.step.modes.settle`) and
returns the metrics it writes to `model_dir/metrics.json`; `python -m trainer` hands it the `Plan` it settled.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time

import tensorflow as tf

import tasks as tasks_lib
from launch.job import cluster as cluster_lib
from trainer.loop.build import build, log_line
from trainer.loop.controller import Loop
from trainer.outputs import attempts as attempts_lib
from trainer.outputs import banner, report, rundir
from trainer.outputs.event_files import purge_events
from trainer.outputs.export import export_saved_model
from trainer.outputs.summaries import Summaries, variable_tags
from trainer.settings.config import RunConfig
from trainer.step import modes
from trainer.step.asynchronous.gate import TowerFailed
from trainer.step.core import micro_batch as towers
from trainer.system import distributed, peers, stall
from trainer.system import stop as stop_lib


def train(run: RunConfig | modes.Plan, stop: stop_lib.StopRequest | None = None, cluster=None) -> dict:
    """Trains (or resumes) the run `config` describes; returns the metrics written to `metrics.json`.

    Stop signals (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2) are honoured after the current step: the run
    checkpoints and raises `trainer.system.stop.StopRequested`; after a time-limit warning under Slurm it has
    also requeued its job (`trainer.outputs.attempts.after_stop`).

    Args:
      run: the run: a settled `trainer.step.modes.Plan`, used as it is, or a `RunConfig`, settled here once.
      stop: the stop request to honour (the process-wide `trainer.system.stop.REQUEST` by default).
      cluster: a `launch.job.cluster.Cluster` of several tasks whose chief this process is, already connected
        (`trainer.system.distributed.connect`); None: this machine alone. `config.towers.num_tasks` is its size.

    Raises:
      trainer.system.distributed.WorkerLost: a worker task died or never started; the message names it.
    """
    stop = stop or stop_lib.REQUEST
    plan = modes.planned(run)
    config = plan.config
    os.makedirs(config.loop.model_dir, exist_ok=True)
    with rundir.RunLock(config.loop.model_dir), stop.handling():
        task = tasks_lib.make_task(config)
        facts = {"task_facts": task.describe(), "model_facts": task.model_facts}
        by_name = task.named_model() is not None
        rundir.check_resume(plan, config.loop.allow_flag_changes, log=log_line, **facts, model_by_name=by_name)
        rundir.record_flags(config.loop.model_dir, config.flags_text)
        attempts = attempts_lib.AttemptLog(config.loop.model_dir)
        job = cluster_lib.slurm_job(os.environ)
        try:
            return _train_attempt(plan, task, stop, attempts, job, cluster)
        except stop_lib.StopRequested as e:
            log_line(str(e))
            line = attempts_lib.after_stop(attempts, e, job, config.loop.max_requeues, config.loop.train_steps)
            log_line(line)
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


def _train_attempt(plan: modes.Plan, task, stop, attempts: attempts_lib.AttemptLog, job, cluster) -> dict:
    """One attempt: build, resume, train, evaluate, export, write metrics.json; with several tasks, a watch
    of the workers ends the process (75) when one is lost, and one of the steps when they stop finishing."""
    _raise_if_stopped(stop, "before the model was built")
    if cluster is None or cluster.num_tasks == 1:
        return _build_and_train(plan, task, stop, attempts, job, stall_watch=None)
    workers = dict(enumerate(cluster.workers))
    del workers[0]
    describe = functools.partial(distributed.describe_task, cluster)
    lost = lambda message: attempts.end(f"{attempts_lib.LOST}: {message}")  # noqa: E731
    timeout_sec = plan.config.cluster.peer_timeout_sec
    with peers.PeerWatch(workers, describe, timeout_sec, on_lost=lost) as watch:
        tasks = ", ".join(f"task {task} {address}" for task, address in enumerate(cluster.workers))
        stall_watch = functools.partial(
            stall.StallWatch,
            timeout_sec=timeout_sec,
            what=f"one of the tasks ({tasks})",
            on_lost=lost,
            silent=watch.silent,
        )
        return _build_and_train(plan, task, stop, attempts, job, stall_watch)


def _build_and_train(plan: modes.Plan, task, stop, attempts: attempts_lib.AttemptLog, job, stall_watch) -> dict:
    started = time.monotonic()
    config = plan.config
    state = build(plan, task=task)
    _raise_if_stopped(stop, "before training started")
    restored = state.checkpointer.restore_latest()
    if restored:
        for stream in state.iterators:
            stream.restart()  # at the restored position
    step = int(state.global_step.numpy())
    where = f"resumed from {restored} at step {step}" if restored else "fresh start at step 0"
    for line in banner.start_lines(config, state):
        log_line(line)
    finished = report.finished_metrics(config.loop.model_dir, config.loop.train_steps, step, state.model, log_line)
    if finished is not None:
        log_line(f"already complete: step {step} of --train_steps={config.loop.train_steps}; nothing to do")
        return finished
    attempt = attempts.begin(step, job)
    log_line(_start_line(attempt, job, where))
    dropped = purge_events(config.loop.model_dir, attempt.resumed_from_step, log=log_line)
    if dropped:
        log_line(f"TensorBoard: dropped {dropped} events written after step {attempt.resumed_from_step}")
    with stop_lib.out_of_space(f"writing to {config.loop.model_dir} (TensorBoard events)", lambda: _kept(state)):
        results = _run_loop(config, state, attempts, stop, stall_watch)
    with stop_lib.out_of_space(f"exporting to {config.loop.model_dir}", lambda: _kept(state)):
        export_dir = _export(config, state, results["global_step"])
        attempts.end("finished")
        metrics = report.final_metrics(state, results, attempts.examples_per_sec(), attempts.summary())
        report.write_json(os.path.join(config.loop.model_dir, "metrics.json"), metrics)
    for line in banner.end_lines(config, metrics, time.monotonic() - started, export_dir):
        log_line(line)
    return metrics


def _kept(state) -> str:
    return f"the last whole checkpoint is {state.checkpointer.manager.latest_checkpoint or 'none'}"


def _export(config: RunConfig, state, step: int) -> str | None:
    """Exports the SavedModel of step `step` (kept if it exists); its directory, or None without --export."""
    if not config.loop.export:
        return None
    _require_finite(state.model, step, "exporting")
    serving = state.reader.serving(state.inputs, state.data_settings)
    export_saved_model(state.model, config, serving, step, log_line)  # None: kept an existing one
    return os.path.join(config.loop.model_dir, "export", str(step))


def _require_finite(model, step: int, doing: str) -> None:
    if not towers.all_finite(model.variables):
        raise stop_lib.Diverged(f"a weight was not finite at step {step}; not {doing} (the last checkpoint is kept)")


def _raise_if_stopped(stop: stop_lib.StopRequest, when: str) -> None:
    if stop.requested:
        message = f"stopped by {stop.describe()} {when}; nothing to save"
        raise stop_lib.StopRequested(message, stop.signum, None, signalled_while_training=False)


def _run_loop(config: RunConfig, state, attempts: attempts_lib.AttemptLog, stop: stop_lib.StopRequest, stall_watch):
    """Runs the loop, recording the attempt's progress at every checkpoint; `stall_watch` (several tasks)
    makes the `trainer.system.stall.StallWatch` of the mode's finished steps."""
    placement = state.placement
    num_stages = config.towers.pipeline.stages
    tags = [placement.tower_tag(i, num_stages) for i in range(len(placement.towers))]
    summaries = Summaries(config.loop.model_dir, tags)
    task = state.task  # HParams columns: the metric runs are ranked by first
    ranked = tuple(sorted(task.metric_names, key=lambda name: name != task.eval_metric))
    summaries.hparams(state.plan, task.model_description(state.model), ranked)
    trainable = state.model.trainable_variables

    def on_checkpoint(step: int) -> None:
        attempts.progress(step, *loop.throughput.totals())

    loop = Loop(
        state.updater,
        config.loop,
        state.evaluator,
        state.checkpointer,
        summaries,
        trainable,
        variable_tags(trainable),
        log=log_line,
        stop=stop,
        on_checkpoint=on_checkpoint,
        before_save=lambda step: _require_finite(state.model, step, "saving a checkpoint"),
        extra_scalars=lambda: {"bad_records": state.bad_records.count} if state.bad_records else {},
        stall=stall_watch(lambda: state.updater.steps_finished) if stall_watch else None,
        num_tasks=placement.num_tasks,
    )
    try:
        with loop.stall or contextlib.nullcontext():
            return loop.run()
    except (tf.errors.OpError, TowerFailed) as e:  # what `next(iterator)` in a step raised for bad data
        explained = state.bad_records and state.bad_records.explain(e, training=True, log=log_line)
        explained = explained or state.reader.explain_failure(e, "--train_data")
        if explained is None:
            raise
        raise explained from e
    except stop_lib.Diverged as e:  # NaN or inf features reach the towers unchecked: name the record, exit 2
        explained = state.bad_records and state.bad_records.explain_divergence(e, log=log_line)
        if explained is None:
            raise
        raise explained from e
    finally:
        state.updater.close()
        summaries.close()


def _start_line(attempt: attempts_lib.Attempt, job, where: str) -> str:
    who = f"; {job.describe()}" if job is not None else ""
    return f"attempt {attempt.attempt} (host {attempt.host}, pid {attempt.pid}{who}): {where}"
