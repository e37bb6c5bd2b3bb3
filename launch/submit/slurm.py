"""`python -m launch.slurm`: render a towerflow job's sbatch script into MODEL_DIR/slurm/ and submit it.

    python -m launch.slurm --model_dir=DIR [--nodes=M|MIN-MAX] [--tasks_per_node=T] [--gpus_per_node=G]
        [--cpus_per_task=C] [--time=HH:MM:SS] [--partition=P] [--account=A] [--sbatch_arg=--qos=high ...]
        [--max_requeues=N] [--dry_run] -- TRAINER_FLAGS...

With M*T > 1 the job runs M*T trainer tasks (srun), each with the same flags; `--num_gpus` is per task, so
the run has M*T*num_gpus towers. The normal layout is one task per node driving all its GPUs (T=1, the
default); T > 1 is mainly for testing several tasks on one node. `--nodes=MIN-MAX` (Slurm's range) starts on
as many nodes as Slurm gives, every count in the range checked first; a resume may have another count (the
weights do not depend on it: docs/towers.md), as Slurm allocates a requeued job afresh, up to MAX of the nodes
idle then (tests/launch/test_node_counts.py). With T > 1, Slurm starts a range on MIN nodes (the task count
is fixed at MIN x T when the job is submitted).

The trainer flags are checked before anything is submitted (a typo fails now, not after hours in the
queue), for the run's real number of tasks. What the script does and why: `launch/submit/sbatch.py`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys

from launch.job import cluster
from launch.submit import sbatch


class SubmitError(RuntimeError):
    """sbatch failed; the message has its output."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launch.slurm",
        description="Render and submit a towerflow Slurm job. Trainer flags go after `--`.",
    )
    p.add_argument("--model_dir", required=True, help="the run's directory (shared storage); logs go to DIR/slurm/")
    p.add_argument(
        "--nodes",
        default="1",
        help="nodes, M or MIN-MAX (Slurm starts the job on as many as it can give); more than 1 runs one trainer "
        "task per node (srun)",
    )
    p.add_argument(
        "--tasks_per_node",
        type=int,
        default=1,
        help="trainer tasks per node (default 1: one task per node driving all its GPUs, the normal layout; "
        "more is mainly for testing several tasks on one node)",
    )
    p.add_argument(
        "--gpus_per_node",
        type=int,
        default=None,
        help="GPUs per node; default: --tasks_per_node times the trainer's --num_gpus (which is per task)",
    )
    p.add_argument("--cpus_per_task", type=int, default=0, help="CPUs per trainer task (input pipeline); 0: default")
    p.add_argument("--time", default="", help="time limit (HH:MM:SS, D-HH:MM, ...); '': the partition's")
    p.add_argument(
        "--warning_sec",
        type=int,
        default=0,
        help="SIGUSR1 this many seconds before the time limit (checkpoint + requeue); 0: 5%% of --time, 90..300 s",
    )
    p.add_argument("--partition", default="", help="Slurm partition")
    p.add_argument("--account", default="", help="Slurm account")
    p.add_argument("--job_name", default="", help="default: towerflow-<basename of --model_dir>")
    p.add_argument("--sbatch_arg", action="append", default=[], help="extra sbatch option, repeatable")
    p.add_argument(
        "--max_requeues",
        type=int,
        default=3,
        help="requeues (time limit, lost task) in a row without a step trained (after progress: unlimited)",
    )
    p.add_argument("--dry_run", action="store_true", help="print the script, submit nothing")
    return p


def parse_nodes(text: str) -> tuple[int, int]:
    """(fewest, most) nodes from `M` or `MIN-MAX`.

    Raises:
      sbatch.SpecError: not that form, or not 1 <= MIN <= MAX.
    """
    fewest, _, most = text.partition("-")
    try:
        low, high = int(fewest), int(most or fewest)
    except ValueError:
        raise sbatch.SpecError(f"--nodes ({text!r}) must be a number of nodes, M, or a range, MIN-MAX") from None
    if not 1 <= low <= high:
        raise sbatch.SpecError(f"--nodes ({text}) must be >= 1, and MIN <= MAX in MIN-MAX")
    return low, high


def _flags_on_every_count(trainer_args: list[str], node_counts: range, tasks_per_node: int, nodes: str):
    """The trainer flags, validated for every number of nodes the job may get; the first refusal names it."""
    for count in node_counts:
        try:
            values = _trainer_flags(trainer_args, count * tasks_per_node)
        except sbatch.SpecError as e:
            if len(node_counts) == 1:
                raise
            raise sbatch.SpecError(f"on {count} of --nodes={nodes} nodes: {e}") from e
    return values


def _trainer_flags(trainer_args: list[str], num_tasks: int = 1):
    """Parses and validates the trainer flags exactly as `python -m trainer` would (without TensorFlow), as
    one of `num_tasks` tasks (the number of towers, hence e.g. --micro_batches, depends on it).

    Raises:
      sbatch.SpecError: an unknown flag or a bad value, with the trainer's message.
    """
    from absl import flags  # noqa: PLC0415

    from trainer.settings import config as cfg  # noqa: PLC0415
    from trainer.settings import flags as trainer_flags  # noqa: PLC0415
    from trainer.step import modes  # noqa: PLC0415
    from trainer.system import packages  # noqa: PLC0415

    try:  # the job starts in this directory: a models.py here would stop it there, after the queue
        packages.claim()
    except packages.ShadowedPackage as e:
        raise sbatch.SpecError(str(e)) from e
    trainer_flags.define_flags()  # on absl's global FLAGS, as `python -m trainer` does (idempotent)
    values = flags.FLAGS
    values.unparse_flags()  # forget an earlier parse in this process (tests call main() repeatedly)
    try:
        values(["trainer", *trainer_args])
        modes.settle(trainer_flags.config_from_flags(values), num_tasks=num_tasks)
    except (flags.Error, cfg.ConfigError) as e:
        raise sbatch.SpecError(f"trainer flags: {e}") from e
    return values


def spec_from_args(args: argparse.Namespace, trainer_args: list[str]) -> sbatch.JobSpec:
    """Resolves the job from the launcher's options and the trainer's flags.

    Raises:
      sbatch.SpecError: conflicting or invalid options, naming them.
    """
    if any(a.startswith("--model_dir") for a in trainer_args):
        raise sbatch.SpecError("give --model_dir to launch.slurm (before `--`), not among the trainer flags")
    model_dir = os.path.abspath(args.model_dir)
    tasks_per_node = args.tasks_per_node
    fewest, most = parse_nodes(str(args.nodes))
    if tasks_per_node < 1:
        raise sbatch.SpecError(f"--tasks_per_node ({tasks_per_node}) must be >= 1")
    values = _trainer_flags([*trainer_args, f"--model_dir={model_dir}"])
    if args.gpus_per_node is not None and values.device != "cpu" and not values["num_gpus"].present:
        if args.gpus_per_node % tasks_per_node:
            raise sbatch.SpecError(
                f"--gpus_per_node ({args.gpus_per_node}) must be a multiple of --tasks_per_node ({tasks_per_node})"
            )
        trainer_args = [*trainer_args, f"--num_gpus={args.gpus_per_node // tasks_per_node}"]
    counts = range(fewest, most + 1)
    values = _flags_on_every_count([*trainer_args, f"--model_dir={model_dir}"], counts, tasks_per_node, args.nodes)
    gpus = 0 if values.device == "cpu" else values.num_gpus * tasks_per_node
    if args.gpus_per_node is not None and values.device != "cpu" and args.gpus_per_node != gpus:
        per_task = f" x --tasks_per_node ({tasks_per_node})" if tasks_per_node > 1 else ""
        raise sbatch.SpecError(
            f"--gpus_per_node ({args.gpus_per_node}) differs from the trainer's --num_gpus ({values.num_gpus})"
            f"{per_task}"
        )
    if tasks_per_node > cluster.PORTS_PER_NODE and not values.cluster_port:
        raise sbatch.SpecError(
            f"--tasks_per_node ({tasks_per_node}): the ports derived from the job id leave room for "
            f"{cluster.PORTS_PER_NODE} tasks per node; pass the trainer --cluster_port (a free range of ports)"
        )
    spec = sbatch.JobSpec(
        model_dir=model_dir,
        trainer_args=tuple(trainer_args),
        python=sys.executable,
        workdir=os.getcwd(),
        job_name=args.job_name or f"towerflow-{os.path.basename(model_dir.rstrip('/'))}",
        nodes=most,
        min_nodes=fewest,
        tasks_per_node=tasks_per_node,
        gpus_per_node=gpus,
        cpus_per_task=args.cpus_per_task,
        time=args.time,
        warning_sec=args.warning_sec,
        partition=args.partition,
        account=args.account,
        sbatch_args=tuple(args.sbatch_arg),
        max_requeues=args.max_requeues,
    )
    return sbatch.validate(spec)


def submit(script_path: str, environ=None) -> str:
    """Submits with `sbatch --parsable`; returns the job id.

    Raises:
      SubmitError: sbatch is missing or refused the job, with its message.
    """
    try:
        result = subprocess.run(
            ["sbatch", "--parsable", script_path], capture_output=True, text=True, timeout=120, env=environ
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SubmitError(f"sbatch could not run: {e}") from e
    if result.returncode != 0:
        raise SubmitError(f"sbatch exited {result.returncode}: {(result.stderr or result.stdout).strip()}")
    return result.stdout.strip().split(";")[0]


def write_script(spec: sbatch.JobSpec, text: str) -> str:
    """Writes the script to MODEL_DIR/slurm/<job name>-<UTC time>.sbatch; returns its path."""
    directory = os.path.join(spec.model_dir, "slurm")
    os.makedirs(directory, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = os.path.join(directory, f"{spec.job_name}-{stamp}.sbatch")
    with open(path, "w") as f:
        f.write(text)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = _parser().parse_args(argv[:split])
    try:
        spec = spec_from_args(args, argv[split + 1 :])
        text = sbatch.render(spec)
    except sbatch.SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(text, end="")
        return 0
    path = write_script(spec, text)
    try:
        job_id = submit(path)
    except SubmitError as e:
        print(f"error: {e} (script kept at {path})", file=sys.stderr)
        return 1
    log = spec.log_path.replace("%x", spec.job_name).replace("%j", job_id)
    print(f"script:  {path}")
    print(f"log:     {log}  (appended across requeues)")
    print(f"follow:  squeue -j {job_id}   tail -f {log}   tensorboard --logdir {spec.model_dir}")
    print(f"submitted job {job_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
