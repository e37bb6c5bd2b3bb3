"""The sbatch script of a towerflow job: rendered from a `JobSpec`, pure text, no Slurm needed.

One task (`--nodes=1 --tasks_per_node=1`, the default): what the script does, and why:
- `exec` makes the trainer the batch task itself. Slurm signals a job's task, not the task's children
  (SIGKILL aside): a trainer started as a child of the batch shell never sees the SIGTERM of a preemption or
  of `scontrol requeue`, and loses everything since its last checkpoint.
- `--signal=B:USR1@W` asks for SIGUSR1 W seconds before the time limit, sent to the batch task (`B:`), which
  is the trainer: it checkpoints after the current step and requeues the job (`launch/job/requeue.py`) after any
  attempt that trained; `--max_requeues` caps the requeues in a row that did not. Slurm checks the limits
  about every 30 s, so the warning comes W to W+30 s early.
- `--requeue`: Slurm requeues a preempted job by itself; the next start resumes from the checkpoint.
- `--open-mode=append` with the job id in the log's name: every attempt of a job appends to one log (Slurm's
  default truncates it at each restart).
- The Python interpreter and working directory are the ones the job was submitted from.

Several tasks (`--nodes=M`, `--tasks_per_node=T`, M*T > 1): every task runs the same `python -m trainer`;
task 0 (the first task of the first node) is the chief, the others serve their devices to it
(`trainer/system/distributed.py`, `launch/job/cluster.py`). The normal layout is one task per node driving all the
node's GPUs (`--num_gpus` is per task); T > 1 is mainly for trying several tasks on one machine.
- `srun --kill-on-bad-exit=1 --label python -m trainer ...`: starts the M*T
  tasks as one job step (block distribution, which `launch.job.cluster` expects); a task that fails (a dead
  worker, a bad flag on one node) ends the whole step instead of leaving the others waiting; `--label`
  starts every line of the log with its task's number (`1: step ...`).
- `--signal=USR1@W` without `B:`: Slurm then signals every task of every job step, and not the batch shell
  (srun). The chief is a step task, so it gets the warning itself, directly from its node's slurmstepd;
  workers ignore stop signals and leave with the chief's exit code. `B:` would signal only srun.
- Does srun forward SIGTERM to the tasks on preemption or requeue? It need not, and it does not. Preemption
  and `scontrol requeue` send SIGCONT+SIGTERM to every step of the job, the batch step (srun) included, then
  SIGKILL KillWait seconds later (slurmd.log: "Sent signal 15 to StepId=J.0" and "... J.batch"): each task
  hears SIGTERM from its own node's slurmstepd. srun, given SIGTERM (or SIGHUP/SIGQUIT), does not pass it
  on: it logs "forcing job termination" and asks for SIGKILL on its tasks (srun's signal handler; the other
  signals, USR1 among them, it forwards as they are; `man srun`: "Signals sent to the srun command are
  automatically forwarded to the tasks it is controlling with a few exceptions"). On Slurm 22.05 with
  proctrack/cgroup that SIGKILL did not cut the tasks' grace short during a requeue (the step is already
  being cancelled): the chief finished its step, checkpointed and exited 75 a second later
  (tests/launch/test_slurm_jobs.py). Elsewhere, treat KillWait as the budget for the step in progress plus one
  checkpoint. `scancel --signal=TERM JOB` (no --full/--batch) signals the step tasks only, not srun.
- After the step, the batch shell (on the first node, the chief's) runs `python -m launch.job.lost`:
  when the run's last attempt ended because a task was lost (`--peer_timeout_sec` passed, a killed task, the
  chief killed without a word), it requeues the job (`scontrol requeue`), capped like a time-limit requeue
  (`launch/job/requeue.py`), and records it in attempts.json. Anything else (finished, stopped by a signal, a
  time-limit requeue already made, bad flags) it leaves alone. The shell traps SIGTERM so that it outlives a
  preemption's signal until srun has ended; srun itself hears the SIGTERM as it did as the batch task.
- At its start the script exports the job's end time (`squeue -o %e`, once; Slurm 22.05 has no variable for
  it): the requeue after a lost task or a time-limit warning is retried while the controller does not
  answer, until then (`launch/job/requeue.py`). srun passes the variable on to the tasks.
- srun does not inherit sbatch's --cpus-per-task (Slurm >= 22.05), so the script passes it again; with
  T > 1 GPU tasks per node, `--gpu-bind=per_task:G` gives each task its own G GPUs.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import shlex

from launch.job.requeue import END_TIME_VARIABLES

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
    nodes: int = 1  # the most nodes (Slurm's --nodes=min_nodes-nodes)
    min_nodes: int = 0  # the fewest nodes the job may start on; 0: exactly `nodes`
    tasks_per_node: int = 1  # trainer tasks on each node; one per node driving all its GPUs is the normal layout
    gpus_per_node: int = 0  # 0: no GPUs (--device=cpu); tasks_per_node * the trainer's --num_gpus
    cpus_per_task: int = 0  # 0: Slurm's default
    time: str = ""  # Slurm's time format; "": the partition's default limit
    warning_sec: int = 0  # 0: derived from `time` (default_warning_sec)
    partition: str = ""
    account: str = ""
    sbatch_args: tuple[str, ...] = ()
    max_requeues: int = 3

    @property
    def num_tasks(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def node_counts(self) -> range:
        """Every number of nodes the job may run on."""
        return range(self.min_nodes or self.nodes, self.nodes + 1)

    @property
    def nodes_option(self) -> str:
        """Slurm's --nodes value: M, or MIN-MAX."""
        return f"{self.min_nodes}-{self.nodes}" if self.min_nodes and self.min_nodes != self.nodes else str(self.nodes)

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
    for name in ("nodes", "tasks_per_node"):
        if getattr(spec, name) < 1:
            raise SpecError(f"--{name} ({getattr(spec, name)}) must be >= 1")
    if not 0 <= spec.min_nodes <= spec.nodes:
        raise SpecError(f"--nodes ({spec.nodes_option}): the fewest nodes must be between 1 and the most")
    if spec.gpus_per_node % spec.tasks_per_node:
        raise SpecError(
            f"--gpus_per_node ({spec.gpus_per_node}) must be a multiple of --tasks_per_node ({spec.tasks_per_node}): "
            f"every task drives the same number of GPUs"
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
        f"--nodes={spec.nodes_option}",
        # One task per node is Slurm's default. Said explicitly, it fixes the job's task count at MIN x 1 when
        # it is submitted, and Slurm 22.05 then starts a MIN-MAX job on MIN nodes with MAX idle (measured on
        # the two-node test Slurm); unsaid, the job gets as many idle nodes as the range allows.
        *([f"--ntasks-per-node={spec.tasks_per_node}"] if spec.tasks_per_node > 1 else []),
        # one task: the batch task is the trainer (B:); several: every step task, so the chief (see the top)
        f"--signal={'B:' if spec.num_tasks == 1 else ''}{WARNING_SIGNAL}@{warning}",
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


def _srun(spec: JobSpec) -> list[str]:
    """srun and its options, for a job of several tasks (each gets the allocation's tasks, block-distributed)."""
    srun = ["srun", "--kill-on-bad-exit=1", "--label"]  # --label: every line of the log says its task
    if spec.cpus_per_task:
        srun.append(f"--cpus-per-task={spec.cpus_per_task}")  # not inherited from sbatch since Slurm 22.05
    if spec.gpus_per_node and spec.tasks_per_node > 1:
        srun.append(f"--gpu-bind=per_task:{spec.gpus_per_node // spec.tasks_per_node}")  # not all on GPU 0..G-1
    return srun


_ONE_TASK_COMMENT = (
    "# exec: the trainer becomes the batch task, so Slurm's SIGTERM (preemption, scontrol requeue) and the",
    "# time-limit warning (--signal=B:USR1) reach it. As a child of this shell it would never see them.",
)
_TASKS_COMMENT = (
    "# {n} tasks run `python -m trainer` with the same flags; task 0 is the chief, the others serve it.",
    "# The time-limit warning is --signal=USR1 without B: Slurm sends it to every task",
    "# of every step (B: would reach only srun), so the chief gets it, checkpoints and requeues the job; workers",
    "# ignore stop signals and exit with the chief's code. Preemption and scontrol requeue send SIGTERM to every",
    "# task directly too. srun does not forward a SIGTERM it gets (it asks for SIGKILL instead); on Slurm 22.05",
    "# that does not cut short the tasks' KillWait grace when the job is being requeued. --kill-on-bad-exit=1:",
    "# a failed task ends the step rather than leaving the others waiting for it. After the step, a lost task",
    "# (a node cut off or frozen past --peer_timeout_sec, a killed task) requeues the job: launch.job.lost.",
)


_END_TIME = (
    "# The job's end time, read once while the controller surely answers: a requeue retried when it does not",
    "# (this node's network down) gives up there (launch/job/requeue.py). NONE without a time limit.",
    f'export {END_TIME_VARIABLES[-1]}="$(timeout 30 squeue -h -j "$SLURM_JOB_ID" -o %e 2>/dev/null || true)"',
)


def render(spec: JobSpec) -> str:
    """The sbatch script of `spec` (validated first)."""
    validate(spec)
    command = [spec.python, "-u", "-m", "trainer", f"--model_dir={spec.model_dir}"]
    command += [f"--max_requeues={spec.max_requeues}", *spec.trainer_args]
    comment, run = _ONE_TASK_COMMENT, ["exec " + _shell(command)]
    if spec.num_tasks > 1:
        comment = tuple(line.format(n=spec.num_tasks) for line in _TASKS_COMMENT)
        run = _step_then_requeue_if_lost(spec, [*_srun(spec), *command])
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lines = [
        "#!/bin/bash",
        f"# Rendered by `python -m launch.slurm` at {stamp}; submit it with sbatch.",
        *(f"#SBATCH {option}" for option in _sbatch_options(spec)),
        "set -eu",
        f"cd {shlex.quote(spec.workdir)}",
        'echo "=== towerflow: job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on $(hostname) at $(date -Is)"',
        *_END_TIME,
        *comment,
        *run,
    ]
    return "\n".join(lines) + "\n"


def _shell(command: list[str]) -> str:
    return " ".join(shlex.quote(part) for part in command)


def _step_then_requeue_if_lost(spec: JobSpec, srun: list[str]) -> list[str]:
    """The batch shell starts the step, and `launch.job.lost` waits for it: it ends an srun that still
    waits for a task 30 s after the chief's attempt ended (a node's task-exit message lost in an outage), then
    asks the run's attempts.json (the chief's node is this one) whether a task was lost, requeueing the job if
    so. The TERM trap keeps the shell alive while the tasks checkpoint after a preemption."""
    requeue = [spec.python, "-u", "-m", "launch.job.lost", f"--model_dir={spec.model_dir}"]
    return [
        "trap 'echo \"=== towerflow: SIGTERM to the batch shell\"' TERM",
        _shell(srun) + " &",
        "step=$!",
        _shell([*requeue, f"--max_requeues={spec.max_requeues}"]) + ' --srun_pid="$step" || true',
        'code=0; wait "$step" || code=$?',
        'exit "$code"',
    ]
