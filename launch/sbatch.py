"""The sbatch script of a towerflow job: rendered from a `JobSpec`, pure text, no Slurm needed.

What the script does, and why:
- `exec` makes the trainer the batch task itself. Slurm signals a job's task, not the task's children
  (SIGKILL aside): a trainer started as a child of the batch shell never sees the SIGTERM of a preemption or
  of `scontrol requeue`, and loses everything since its last checkpoint.
- `--signal=B:USR1@W` asks for SIGUSR1 W seconds before the time limit, sent to the batch task (`B:`), which
  is the trainer: it checkpoints after the current step and requeues the job (`launch/requeue.py`), at most
  `--max_requeues` times. Slurm checks the limits about every 30 s, so the warning comes W to W+30 s early.
- `--requeue`: Slurm requeues a preempted job by itself; the next start resumes from the checkpoint.
- `--open-mode=append` with the job id in the log's name: every attempt of a job appends to one log (Slurm's
  default truncates it at each restart).
- The Python interpreter and working directory are the ones the job was submitted from.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import shlex

WARNING_SIGNAL = "USR1"
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


class SpecError(ValueError):
    """A job option is invalid; the message names the option and what to change."""


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One towerflow job. `trainer_args` are `python -m trainer` flags (without --model_dir)."""

    model_dir: str  # absolute
    trainer_args: tuple[str, ...]
    python: str
    workdir: str
    job_name: str = "towerflow"
    nodes: int = 1
    gpus_per_node: int = 0  # 0: no GPUs (--device=cpu)
    cpus_per_task: int = 0  # 0: Slurm's default
    time: str = ""  # Slurm's time format; "": the partition's default limit
    warning_sec: int = 0  # 0: derived from `time` (default_warning_sec)
    partition: str = ""
    account: str = ""
    sbatch_args: tuple[str, ...] = ()
    max_requeues: int = 3

    @property
    def log_path(self) -> str:
        """Slurm's --output pattern: %x the job name, %j the job id (each array task has its own)."""
        return f"{self.model_dir}/slurm/%x-%j.log"


def parse_time_sec(text: str) -> int:
    """Seconds in a Slurm time limit: M, M:S, H:M:S, D-H, D-H:M or D-H:M:S.

    Raises:
      SpecError: not one of those forms.
    """
    match = _TIME.match(text.strip())
    if not match:
        raise SpecError(f"--time ({text!r}) must be a Slurm time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    days, first, second, third = match.groups()
    if days is not None:  # D-H[:M[:S]]
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if third is not None:  # H:M:S
        return (int(first) * 60 + int(second)) * 60 + int(third)
    return int(first) * 60 + int(second or 0)  # M or M:S


def default_warning_sec(time_sec: int | None) -> int:
    """How long before the time limit to warn: time for the step in progress and one checkpoint.

    5% of the limit, between 90 s and 300 s, and never more than half of it (a 1-minute test job is warned
    30 s early). Without a limit (the partition's applies), 300 s.
    """
    if not time_sec:
        return 300
    return max(1, min(300, max(90, time_sec // 20), time_sec // 2))


def validate(spec: JobSpec) -> JobSpec:
    """Checks what needs no Slurm; returns `spec`. Raises SpecError naming the option."""
    if spec.nodes != 1:
        raise SpecError(
            f"--nodes ({spec.nodes}): towerflow trains on the GPUs of one node per job for now "
            f"(multi-node training is not implemented); use --nodes=1 and --gpus_per_node"
        )
    if re.search(r"\s", spec.model_dir):
        raise SpecError(f"--model_dir ({spec.model_dir!r}) must not contain white space (#SBATCH --output cannot)")
    for name in ("gpus_per_node", "cpus_per_task", "warning_sec", "max_requeues"):
        if getattr(spec, name) < 0:
            raise SpecError(f"--{name} ({getattr(spec, name)}) must be >= 0")
    if spec.time:
        time_sec = parse_time_sec(spec.time)
        if spec.warning_sec >= time_sec:
            raise SpecError(f"--warning_sec ({spec.warning_sec}) must be shorter than --time ({spec.time})")
    return spec


def _sbatch_options(spec: JobSpec) -> list[str]:
    warning = spec.warning_sec or default_warning_sec(parse_time_sec(spec.time) if spec.time else None)
    options = [
        f"--job-name={spec.job_name}",
        f"--output={spec.log_path}",
        "--open-mode=append",
        "--requeue",
        f"--nodes={spec.nodes}",
        "--ntasks-per-node=1",
        f"--signal=B:{WARNING_SIGNAL}@{warning}",
    ]
    optional = {
        "--gres=gpu:": spec.gpus_per_node,
        "--cpus-per-task=": spec.cpus_per_task,
        "--time=": spec.time,
        "--partition=": spec.partition,
        "--account=": spec.account,
    }
    options += [f"{prefix}{value}" for prefix, value in optional.items() if value]
    return options + list(spec.sbatch_args)


def render(spec: JobSpec) -> str:
    """The sbatch script of `spec` (validated first)."""
    validate(spec)
    command = [spec.python, "-u", "-m", "trainer", f"--model_dir={spec.model_dir}"]
    command += [f"--max_requeues={spec.max_requeues}", *spec.trainer_args]
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lines = [
        "#!/bin/bash",
        f"# Rendered by `python -m launch.slurm` at {stamp}; submit it with sbatch.",
        *(f"#SBATCH {option}" for option in _sbatch_options(spec)),
        "set -eu",
        f"cd {shlex.quote(spec.workdir)}",
        'echo "=== towerflow: job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on $(hostname) at $(date -Is)"',
        "# exec: the trainer becomes the batch task, so Slurm's SIGTERM (preemption, scontrol requeue) and the",
        "# time-limit warning (--signal=B:USR1) reach it. As a child of this shell it would never see them.",
        "exec " + " ".join(shlex.quote(part) for part in command),
    ]
    return "\n".join(lines) + "\n"
