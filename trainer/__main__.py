"""`python -m trainer`: flags -> RunConfig (`trainer.settings`: the table) -> the run's `Plan` (settled once,
here: `trainer.step.modes.settle`, with the cluster's task count) -> train. The only place that reads absl FLAGS.

Stop signals are handled from the first line (before TensorFlow is imported, which takes seconds), and flags
are validated before that import too, so bad input fails at once; so is TensorFlow's environment set (GPUs
hidden with --device=cpu, its C++ logging quiet unless -v/--verbosity: `trainer.system.console`). Before absl parses
the command line, `trainer.cli` answers --help and puts command-line flags after any --flagfile's, so they
win. Exit codes: `trainer.system.stop`.
"""

from __future__ import annotations

import os
import sys

from trainer.system import packages, stop

stop.REQUEST.install()  # a SIGTERM while TensorFlow imports must still end the run cleanly
try:  # before any other package of towerflow's is imported: a user's models.py must not stand in for ours
    packages.claim()
except packages.ShadowedPackage as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(stop.EXIT_USAGE)

import dataclasses  # noqa: E402

from absl import app, flags, logging  # noqa: E402

from launch.job import cluster  # noqa: E402
from trainer import cli  # noqa: E402
from trainer.settings import config as cfg  # noqa: E402
from trainer.settings import flags as tf_flags  # noqa: E402
from trainer.step import modes  # noqa: E402
from trainer.system import console, preflight, runtime, versions  # noqa: E402

tf_flags.define_flags()
FLAGS = flags.FLAGS


def main(argv: list[str]) -> int:
    try:
        return _main(argv)
    finally:
        stop.REQUEST.ignore_from_now()  # the exit code is decided; a late signal must not change it


def _main(argv: list[str]) -> int:
    try:
        asked = tf_flags.config_from_flags(FLAGS)
        tasks = cluster.resolve_cluster(os.environ, asked.cluster.port)
        plan = modes.settle(asked, num_tasks=tasks.num_tasks)  # the run's decisions, once; passed down from here
        preflight.check(plan.config, tasks)  # model_dir, data globs, this task's port: before TensorFlow too
    except ValueError as e:  # ConfigError, or ClusterError: a task layout that cannot work
        print(f"error: {e}", file=sys.stderr)
        return stop.EXIT_USAGE
    config = plan.config
    verbosity = FLAGS.verbosity if FLAGS["verbosity"].present else None
    if verbosity is None:
        logging.set_verbosity(logging.WARNING)  # TensorFlow's Python INFO lines (saver, signatures)
    level = console.prepare_tensorflow(config.towers.device, verbosity)
    os.environ.update(runtime.environment(config.runtime, config.deterministic))  # read by TensorFlow's import
    header = versions.flagfile_header(versions.devices_summary(config.towers))
    config = dataclasses.replace(config, flags_text=header + tf_flags.flagfile_text(FLAGS))  # a record, not a setting
    plan = dataclasses.replace(plan, config=config)

    with console.native_stderr_filtered(level), runtime.without_optional_packages():
        from trainer.system import distributed  # noqa: PLC0415 (deferred: keeps flag errors fast; imports TensorFlow)

    if tasks.num_tasks == 1:
        # Its stderr filtered as a task's of several is: TensorFlow's harmless lines and SentencePiece's come
        # while it runs too, not only while TensorFlow imports (`trainer.system.console`).
        console.filter_from_now(level)
        return _train(plan, None)
    if not tasks.is_chief:
        return distributed.serve(tasks, config, stop.REQUEST)
    try:  # first, so that whatever fails next, the workers hear of it
        distributed.connect(tasks, config, config.cluster.timeout_sec)
    except distributed.WorkerLost as e:
        print(f"error: {e}", file=sys.stderr)
        return stop.EXIT_FAILED
    code = stop.EXIT_FAILED
    try:
        code = _train(plan, tasks)
    finally:
        distributed.tell_workers(tasks, code)  # they exit with it (an exception: 1)
    return code


def _train(plan: modes.Plan, tasks) -> int:
    """Trains the settled `plan` as the only task or the chief; returns the exit code."""
    from data import DataError  # noqa: PLC0415
    from models import ModelError  # noqa: PLC0415
    from tasks import TaskError  # noqa: PLC0415
    from trainer.loop.run import train  # noqa: PLC0415
    from trainer.outputs.checkpoint import CheckpointMismatch  # noqa: PLC0415
    from trainer.system import distributed, graphs  # noqa: PLC0415

    try:
        train(plan, cluster=tasks)
    except (cfg.ConfigError, DataError, ModelError, TaskError, CheckpointMismatch, graphs.GraphCodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return stop.EXIT_USAGE
    except stop.StopRequested:
        return stop.EXIT_RESUMABLE  # train() logged the stop and what happens next
    except stop.Diverged as e:
        print(f"error: training diverged: {e}", file=sys.stderr)
        return stop.EXIT_DIVERGED
    except stop.NoSpace as e:  # free space and rerun: it resumes
        print(f"error: {e}", file=sys.stderr)
        return stop.EXIT_RESUMABLE
    except distributed.WorkerLost as e:  # mid-run: the last checkpoint is whole, a rerun resumes
        print(f"error: {e}", file=sys.stderr)
        return stop.EXIT_RESUMABLE
    return stop.EXIT_OK


def run_and_exit() -> None:
    """`app.run(main)`, then leave through os._exit: the outputs are written and flushed, and the interpreter's
    teardown (seconds with TensorFlow loaded) resets the stop signals to their default action, so a
    time-limit warning arriving then would kill a finished job (Slurm: FAILED 0:10)."""
    try:
        _print_help_and_exit(cli.help_request(sys.argv))
        app.run(main, argv=sys.argv, flags_parser=_parse_flags)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _print_help_and_exit(request: str) -> None:
    if request == "help":
        print(cli.help_text(FLAGS, tf_flags.GROUP_FLAGS, tf_flags.group_blurbs()), end="")
    elif request == "full":
        print(cli.full_help_text(FLAGS), end="")
    if request:
        raise SystemExit(0)


def _parse_flags(argv: list[str]) -> list[str]:
    """app.run's flag parser: a command line absl cannot parse is bad input, said in one line (exit 2), where
    absl would print two and exit 1."""
    try:
        return cli.parse(argv, FLAGS)
    except cli.CommandLineError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(stop.EXIT_USAGE) from None


if __name__ == "__main__":
    run_and_exit()
