"""Surviving Slurm time limits and lost tasks: the job requeues itself.

Slurm never requeues a job that reaches its time limit (it ends TIMEOUT, whatever `--requeue` says), but it
can warn first: `sbatch --signal=B:USR1@T` sends SIGUSR1 T seconds (up to ~30 s more) before the limit. The
trainer checkpoints at the next step boundary and then calls `requeue`, which puts the job back in the queue
(`scontrol requeue`); the next start resumes from that checkpoint. Preemption needs none of this: Slurm
requeues a preempted `--requeue` job by itself, after SIGTERM.

A lost task requeues the job too (`launch.job.lost`, after a multi-task step), by the same rule. A
requeue is refused when it would not help: outside Slurm, when the training is already done,
when an attempt that was already training could not finish a single step before the warning (requeueing it
would only repeat that, forever), or after `max_requeues` requeues in a row that made no progress (no newer
checkpoint than the one they resumed from). A requeue after progress is never capped: a week-long run on a
24-hour partition needs 7 of them, and a run that keeps checkpointing gets there whatever their number.

The requeue is needed exactly when something went wrong, often the network: the node that asks may not reach
the controller at that moment (measured on the two-node test Slurm with the chief's node cut off: `scontrol
requeue` says "Unexpected message received for job J" after ~10 s, `scontrol show job` "Unable to contact
slurm controller (connect failure)"). So every Slurm call made on the run's behalf (`call`) is retried with
backoff, 1, 2, 4 .. 30 s between tries, one line each, until the controller answers or the job's time runs
out (`deadline`); an answer that cannot change with time (`PERMANENT`) is not retried. A try can also take
effect and still fail: the requeue sends SIGTERM to the job's steps, `scontrol` among them (seen on the
three-node test Slurm: the job "CANCELLED ... DUE TO JOB REQUEUE", `scontrol` "exited -15"), and the next
try is told the job is pending. That answer (`ALREADY_REQUEUED`) is the requeue done, not a failure.
"""

from __future__ import annotations

import dataclasses
import datetime
import subprocess
import time
from collections.abc import Callable, Mapping

from launch.job.cluster import SlurmJob

# The file of a run's attempts in model_dir and how each ended (`trainer.outputs.attempts` writes it; the batch
# shell's `launch.job.lost` reads it and records its requeue): what both sides read.
ATTEMPTS_FILE = "attempts.json"
RUNNING = "running"
LOST = "lost a task"  # the outcome the peer watch records (trainer.system.peers)
KILLED = "killed or lost"
REQUEUED = "requeued"  # how every requeued attempt's outcome starts
TIME_LIMIT_REQUEUED = "requeued for the time limit"
LOST_REQUEUED = "requeued after a lost task"


# Slurm's answers to a requeue that no wait can change (slurm_errno.c's words): the job is gone or not this
# user's, or not requeueable (`--no-requeue`, JobRequeue=0: "Requested operation is presently disabled").
# Anything else (connect failures, timeouts, "Unexpected message received", a munge error) is retried.
PERMANENT = (
    "Invalid job id",
    "presently disabled",
    "Access/permission denied",
    "Only batch jobs",
    "already completing or completed",
)
# Slurm's answer to a requeue of a job already back in the queue: an earlier try (or Slurm) requeued it.
ALREADY_REQUEUED = "Job is pending execution"
RETRY_FIRST_SEC, RETRY_MAX_SEC = 1.0, 30.0  # between tries: 1, 2, 4, 8, 16, 30, 30 ..
CALL_TIMEOUT_SEC = 60.0  # one try; an unreachable controller answers within ~20 s (MessageTimeout 10 s)
# The job's end time, epoch seconds or Slurm's local "YYYY-MM-DDTHH:MM:SS": Slurm 22.05 sets no such variable
# (checked), so the batch script exports squeue's %e once at the start (launch/submit/sbatch.py).
END_TIME_VARIABLES = ("SLURM_JOB_END_TIME", "TOWERFLOW_JOB_END_TIME")
DEFAULT_BUDGET_SEC = 3600.0  # no end time known (no time limit, or squeue failed): retry for an hour


class RequeueError(RuntimeError):
    """`scontrol requeue` failed; the message has its output."""


def deadline(environ: Mapping[str, str], now: float | None = None) -> float:
    """Until when (epoch seconds) a Slurm call made for this job may be retried: the job's end time when the
    environment gives it, else `DEFAULT_BUDGET_SEC` from `now`."""
    now = time.time() if now is None else now
    for name in END_TIME_VARIABLES:
        text = environ.get(name, "").strip()
        try:
            return float(text) if text.isdigit() else datetime.datetime.fromisoformat(text).timestamp()
        except ValueError:  # unset, "NONE" (no time limit), "Unknown"
            continue
    return now + DEFAULT_BUDGET_SEC


def say_line(line: str) -> None:
    """One line of the job's log, as the batch shell's other lines."""
    print(f"=== towerflow: {line}", flush=True)


def call(
    command: list[str],
    what: str,
    until: float,
    say: Callable[[str], None] = say_line,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
    already: tuple[str, ...] = (),
) -> str:
    """Runs the Slurm command until it succeeds; returns its output. A failure is tried again after 1, 2, 4 ..
    30 s, saying so in one line, until `until` (epoch seconds) would pass; an answer in `PERMANENT` is not.
    An answer in `already` says the command's effect already holds: it counts as success, said in one line.

    Raises:
      RequeueError: the command is missing, gave a permanent answer, or still failed at `until`.
    """
    delay, tries = RETRY_FIRST_SEC, 0
    while True:
        tries += 1
        done, output = _run(command, CALL_TIMEOUT_SEC)  # a whole try even near `until`: the job's end stops it
        if done:
            return output
        if any(answer in output for answer in already):
            say(f"{what}: already done ({output})")
            return output
        final = output.startswith("could not run") or any(p in output for p in PERMANENT)
        if final or clock() + delay > until:
            why = "" if final else f" ({tries} {'try' if tries == 1 else 'tries'} up to the deadline, {_clock(until)})"
            raise RequeueError(f"{' '.join(command)} {output}{why}")
        again = f"trying again in {delay:.0f} s (until {_clock(until)})"
        say(f"{what}: no answer from Slurm's controller ({output}); {again}")
        sleep(delay)
        delay = min(2 * delay, RETRY_MAX_SEC)


def _run(command: list[str], timeout_sec: float) -> tuple[bool, str]:
    """One try: (succeeded, its output or what went wrong)."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_sec, check=False)
    except OSError as e:
        return False, f"could not run: {e}"
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout_sec:.0f} s"
    output = " ".join((result.stderr or result.stdout).split())
    return result.returncode == 0, output if result.returncode == 0 else f"exited {result.returncode}: {output}"


def _clock(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch).strftime("%H:%M:%S")


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


def requeue(job: SlurmJob, until: float, say: Callable[[str], None] = say_line) -> None:
    """Puts the job back in the queue with `scontrol requeue` (array tasks as `ARRAYJOB_TASK`), retried until
    `until` (`call`).

    Raises:
      RequeueError: scontrol is missing, refused, or never got through; the message says which.
    """
    what = f"requeue of job {job.requeue_target}"
    call(["scontrol", "requeue", job.requeue_target], what, until, say, already=(ALREADY_REQUEUED,))


RESUBMIT = "resubmit the job's script (in the run's model_dir/slurm/) with sbatch: it resumes from the last checkpoint"


def carry_out(
    decision: Decision, job: SlurmJob | None, outcome: str, requeued: str, why: str, until: float
) -> tuple[str, str]:
    """Requeues the job if `decision` says so, retrying until `until`. Returns what to record as the attempt's
    end (`outcome`, and what became of the requeue: prefixed `requeued` when done) and the log line, starting
    with `why`."""
    if not decision.requeue:
        return f"{outcome}; not requeued: {decision.reason}", f"{why}: not requeued: {decision.reason}"
    try:
        requeue(job, until)
    except RequeueError as e:
        return f"{outcome}; requeue failed: {e}", f"{why}: requeue failed: {e}. To go on, {RESUBMIT}."
    return f"{requeued} ({decision.reason}); {outcome}", f"{why}: job {job.requeue_target} requeued ({decision.reason})"
