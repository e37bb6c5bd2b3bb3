"""Surviving Slurm time limits and lost tasks: the job requeues itself.

Slurm never requeues a job that reaches its time limit (it ends TIMEOUT, whatever `--requeue` says), but it
can warn first: `sbatch --signal=B:USR1@T` sends SIGUSR1 T seconds (up to ~30 s more) before the limit. The
trainer checkpoints at the next step boundary and then calls `requeue`, which puts the job back in the queue
(`scontrol requeue`); the next start resumes from that checkpoint. Preemption needs none of this: Slurm
requeues a preempted `--requeue` job by itself, after SIGTERM.

A lost task requeues the job too (`launch.lost`, after a multi-task step), by the same rule. A
requeue is refused when it would not help: outside Slurm, when the training is already done,
when an attempt that was already training could not finish a single step before the warning (requeueing it
would only repeat that, forever), or after `max_requeues` requeues in a row that made no progress (no newer
checkpoint than the one they resumed from). A requeue after progress is never capped: a week-long run on a
24-hour partition needs 7 of them, and a run that keeps checkpointing gets there whatever their number.
"""

from __future__ import annotations

import dataclasses
import subprocess

from launch.cluster import SlurmJob

# The file of a run's attempts in model_dir and how each ended (`trainer.outputs.attempts` writes it; the batch
# shell's `launch.lost` reads it and records its requeue): what both sides read.
ATTEMPTS_FILE = "attempts.json"
RUNNING = "running"
LOST = "lost a task"  # the outcome the peer watch records (trainer.system.peers)
KILLED = "killed or lost"
REQUEUED = "requeued"  # how every requeued attempt's outcome starts
TIME_LIMIT_REQUEUED = "requeued for the time limit"
LOST_REQUEUED = "requeued after a lost task"


class RequeueError(RuntimeError):
    """`scontrol requeue` failed; the message has its output."""


@dataclasses.dataclass(frozen=True)
class Decision:
    requeue: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class History:
    """A job's earlier requeues (time limits, lost tasks): how many in all, and how many of the latest ones in
    a row ended without a newer checkpoint than the one they resumed from."""

    requeues: int = 0
    without_progress: int = 0


def history(earlier: list[dict], job_id: str) -> History:
    """The requeues of Slurm job `job_id` among `earlier` attempts (attempts.json's records, oldest first, the
    current attempt left out): all of them, and the latest ones in a row that checkpointed no newer step than
    they resumed from (any attempt of the job that did ends the row)."""
    ours = [a for a in earlier if a["slurm_job_id"] == job_id]
    without_progress = 0
    for attempt in reversed(ours):
        if attempt["step"] > attempt["resumed_from_step"]:
            break
        without_progress += attempt["outcome"].startswith(REQUEUED)
    return History(sum(a["outcome"].startswith(REQUEUED) for a in ours), without_progress)


def killed(step: int) -> str:
    """The outcome of an attempt that recorded no end (SIGKILL, a lost node, an out-of-memory kill)."""
    return f"{KILLED} (no end recorded; last checkpointed step {step})"


def decide(
    job: SlurmJob | None,
    max_requeues: int,
    history: History,
    steps_left: int,
    steps_trained: int,
    signalled_while_training: bool,
) -> Decision:
    """Whether a run stopped by a time-limit warning should requeue its job.

    Args:
      job: the Slurm job, None outside Slurm.
      max_requeues: the most requeues in a row without progress.
      history: this job's earlier requeues.
      steps_left: steps still to train after the checkpoint just written.
      steps_trained: steps this attempt trained (and checkpointed).
      signalled_while_training: the warning came after the training loop had started (not while the
        process was importing TensorFlow or building the model).
    """
    if job is None:
        return Decision(False, "not a Slurm job: rerun the same command to resume")
    if steps_left <= 0:
        return Decision(False, "training is complete")
    if signalled_while_training and steps_trained == 0:
        return Decision(
            False,
            "no step finished between the start of training and the time-limit warning, so a requeued job "
            "could not progress either; resubmit with a longer --time or an earlier warning",
        )
    number = history.requeues + 1
    if steps_trained > 0:
        return Decision(True, f"requeue {number}, after {steps_trained} steps")
    if history.without_progress >= max_requeues:
        return Decision(
            False,
            f"the job already requeued itself {history.without_progress} times in a row without a step trained "
            f"(--max_requeues={max_requeues}); resubmit it, with a longer --time, to go on",
        )
    return Decision(
        True,
        f"requeue {number}, without a step trained: {history.without_progress + 1} in a row of at most {max_requeues}",
    )


def requeue(job: SlurmJob, timeout_sec: float = 60.0) -> None:
    """Puts the job back in the queue with `scontrol requeue` (array tasks as `ARRAYJOB_TASK`).

    Raises:
      RequeueError: scontrol is missing, failed or timed out; the message says which.
    """
    command = ["scontrol", "requeue", job.requeue_target]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_sec, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RequeueError(f"{' '.join(command)} could not run: {e}") from e
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        raise RequeueError(f"{' '.join(command)} exited {result.returncode}: {output}")


def carry_out(decision: Decision, job: SlurmJob | None, outcome: str, requeued: str, why: str) -> tuple[str, str]:
    """Requeues the job if `decision` says so. Returns what to record as the attempt's end (`outcome`, and what
    became of the requeue: prefixed `requeued` when done) and the log line, starting with `why`."""
    if not decision.requeue:
        return f"{outcome}; not requeued: {decision.reason}", f"{why}: not requeued: {decision.reason}"
    try:
        requeue(job)
    except RequeueError as e:
        return f"{outcome}; requeue failed: {e}", f"{why}: requeue failed: {e}. Resubmit the job to resume."
    return f"{requeued} ({decision.reason}); {outcome}", f"{why}: job {job.requeue_target} requeued ({decision.reason})"
