"""`python -m launch.job.lost --model_dir=DIR --max_requeues=N [--srun_pid=P]`: the end of a multi-task
Slurm job.

The batch script `launch.slurm` renders starts its srun step in the background and runs this on the job's
first node (the chief's, which holds `DIR/attempts.json`):

1. It waits for srun (`--srun_pid`) to end. An srun still running `ENDED_GRACE_SEC` after the chief's attempt
   ended is waiting for a task-exit message that will never come: a node's slurmstepd gives up sending it
   after five tries, so during a network outage longer than those the step would hang for good, the job
   RUNNING with its work gone. It kills that srun (measured on the two-node test Slurm).
2. When the last attempt ended because a task was lost, it requeues the job so that the run comes back by
   itself, as after a time limit (`after_lost_task`, by `launch.job.requeue`'s rule), and records it in
   `DIR/attempts.json` (the file `trainer.outputs.attempts` writes: read and rewritten here as plain JSON).
   When this node cannot reach the controller (its own network is what failed), the requeue is retried
   with backoff until the job's end time (`launch.job.requeue.call`), a line per try.

Stop signals are ignored here, as the batch shell defers them: after a preemption's SIGTERM the tasks
checkpoint while this waits for srun. Nothing here imports TensorFlow: the tool starts at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time

from launch.job import requeue as requeue_lib
from launch.job.cluster import SlurmJob, slurm_job

ENDED_GRACE_SEC = 30.0  # after the chief's attempt ended, srun normally ends within a few seconds
POLL_SEC = 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.job.lost", description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--max_requeues", type=int, default=3)
    parser.add_argument("--srun_pid", type=int, default=0, help="the step's srun, to wait for; 0: none")
    args = parser.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    job = slurm_job(os.environ)
    if args.srun_pid:
        wait_for_srun(args.srun_pid, args.model_dir, job)
    if job is None:
        print("=== towerflow: not a Slurm job: nothing to requeue", flush=True)
        return 0
    until = requeue_lib.deadline(os.environ)  # the job's end time, which the batch script exported
    print(f"=== towerflow: {after_lost_task(args.model_dir, job, args.max_requeues, until)}", flush=True)
    return 0


def after_lost_task(model_dir: str, job: SlurmJob, max_requeues: int, until: float) -> str:
    """After a multi-task job step ended: when the job's last attempt ended because a task was lost (the peer
    watch's outcome, a step failed on a dead worker, or no end recorded: the chief killed), requeues the job
    as `launch.job.requeue.decide` allows, retrying until `until` while the controller does not answer (this node
    may be the one that lost its network), and records it as that attempt's end. Returns a line saying what
    it did."""
    path = os.path.join(model_dir, requeue_lib.ATTEMPTS_FILE)
    attempts = _read(path)
    last = attempts[-1] if attempts else None
    if last is None or last["slurm_job_id"] != job.job_id:
        return "no attempt of this job in attempts.json (it ended before training): not requeued"
    outcome = last["outcome"]
    if not (outcome.startswith((requeue_lib.LOST, "failed: WorkerLost")) or outcome == requeue_lib.RUNNING):
        return f"the attempt ended as {outcome[:80]!r}: nothing to requeue"
    trained = last["step"] - last["resumed_from_step"]
    history = requeue_lib.history(attempts[:-1], job.job_id)
    # steps_left: some (an attempt that finished says "finished"); not a time-limit warning
    decision = requeue_lib.decide(job, max_requeues, history, 1, trained, signalled_while_training=False)
    ended = outcome if outcome != requeue_lib.RUNNING else requeue_lib.killed(last["step"])
    why = "a task was lost"
    last["outcome"], line = requeue_lib.carry_out(decision, job, ended, requeue_lib.LOST_REQUEUED, why, until)
    _write(path, attempts)
    return line


def _read(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):  # none, or unreadable: the trainer keeps an unreadable one aside itself
        return []


def _write(path: str, attempts: list[dict]) -> None:
    """Rewrites attempts.json as the trainer does (`trainer.outputs.report.write_json`): whole or not at all,
    and a failure reported, never raised (the job's end must not hang on its ledger)."""
    try:
        with open(path + ".tmp", "w") as f:
            f.write(json.dumps(attempts, indent=2, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(path + ".tmp")
        print(f"warning: could not write {path}: {e}", file=sys.stderr)


def wait_for_srun(pid: int, model_dir: str, job: SlurmJob | None, grace_sec: float = ENDED_GRACE_SEC) -> None:
    """Until process `pid` has ended (a zombie counts: the batch shell reaps it); kills it when it outlives the
    end of this job's current attempt by `grace_sec`."""
    ended_at = None
    while running(pid):
        if ended_at is None and attempt_ended(model_dir, job):
            ended_at = time.monotonic()
        if ended_at is not None and time.monotonic() - ended_at > grace_sec:
            print(
                f"=== towerflow: srun still waits for a task {grace_sec:.0f} s after the chief's attempt ended (a "
                f"node's task-exit message lost in a network outage); ending it",
                flush=True,
            )
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(POLL_SEC)


def running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def attempt_ended(model_dir: str, job: SlurmJob | None) -> bool:
    """Whether attempts.json's last attempt is this start of the job (same job id and restart count) and has
    recorded how it ended. Read as plain JSON: the chief rewrites the file atomically."""
    try:
        with open(os.path.join(model_dir, requeue_lib.ATTEMPTS_FILE)) as f:
            last = json.load(f)[-1]
    except (OSError, ValueError, IndexError):
        return False
    this_start = (last.get("slurm_job_id"), last.get("slurm_restart_count"))
    ours = job is None or this_start == (job.job_id, job.restart_count)
    return ours and last.get("outcome") != requeue_lib.RUNNING


if __name__ == "__main__":
    sys.exit(main())
