"""`python -m trainer.outputs.lost --model_dir=DIR --max_requeues=N [--srun_pid=P]`: the end of a multi-task
Slurm job.

The batch script `launch.slurm` renders starts its srun step in the background and runs this on the job's
first node (the chief's, which holds `DIR/attempts.json`):

1. It waits for srun (`--srun_pid`) to end. An srun still running `ENDED_GRACE_SEC` after the chief's attempt
   ended is waiting for a task-exit message that will never come: a node's slurmstepd gives up sending it
   after five tries, so during a network outage longer than those the step would hang for good, the job
   RUNNING with its work gone. It kills that srun (measured on the two-node test Slurm).
2. When the last attempt ended because a task was lost, it requeues the job so that the run comes back by
   itself, as after a time limit (`trainer.outputs.attempts.after_lost_task`).

Stop signals are ignored here, as the batch shell defers them: after a preemption's SIGTERM the tasks
checkpoint while this waits for srun. TensorFlow is imported (by the outputs package) but not used.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from launch.cluster import SlurmJob, slurm_job
from trainer.system import console

ENDED_GRACE_SEC = 30.0  # after the chief's attempt ended, srun normally ends within a few seconds
POLL_SEC = 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.outputs.lost", description=__doc__.splitlines()[0])
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
    with console.native_stderr_filtered(console.prepare_tensorflow("cpu", None)):
        from trainer.outputs import attempts as attempts_lib  # noqa: PLC0415 (imports TensorFlow: its lines held)
    line = attempts_lib.after_lost_task(attempts_lib.AttemptLog(args.model_dir), job, args.max_requeues)
    print(f"=== towerflow: {line}", flush=True)
    return 0


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
        with open(os.path.join(model_dir, "attempts.json")) as f:
            last = json.load(f)[-1]
    except (OSError, ValueError, IndexError):
        return False
    this_start = (last.get("slurm_job_id"), last.get("slurm_restart_count"))
    ours = job is None or this_start == (job.job_id, job.restart_count)
    return ours and last.get("outcome") != "running"  # attempts.RUNNING (that module imports TensorFlow)


if __name__ == "__main__":
    sys.exit(main())
