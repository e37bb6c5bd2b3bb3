"""The attempts of a run: every start of training in a `--model_dir` (first start, resumes after a kill, a
preemption or a time limit), one record each in `model_dir/attempts.json`.

A record says who ran (Slurm job, array task, restart count, host), where it resumed, how far it got, how
fast it trained, and how it ended. It is rewritten at every checkpoint, so after a SIGKILL it still holds the
attempt's progress up to the checkpoint the next attempt resumes from, and the run's throughput over all
attempts (steps trained / training seconds summed) counts no step twice.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import sys

from launch.job import requeue as requeue_lib
from launch.job.cluster import SlurmJob
from launch.job.requeue import LOST, RUNNING, TIME_LIMIT_REQUEUED  # noqa: F401 (LOST: what the run records)
from trainer.outputs import report
from trainer.outputs.progress import Rate
from trainer.system.stop import TIME_LIMIT_SIGNALS, StopRequested

FILE_NAME = requeue_lib.ATTEMPTS_FILE


@dataclasses.dataclass
class Attempt:
    attempt: int  # 1 for the first start in this model_dir
    started: str  # UTC, ISO 8601
    host: str
    pid: int
    resumed_from_step: int
    slurm_job_id: str = ""
    slurm_array_task: str = ""  # ARRAYJOB_TASK for an array task
    slurm_restart_count: int | None = None
    step: int = 0  # the last step this attempt checkpointed
    examples: int = 0  # examples and seconds `trainer.outputs.progress.Throughput` counts of the attempt
    train_sec: float = 0.0
    outcome: str = RUNNING

    @property
    def examples_per_sec(self) -> float:
        return Rate(self.examples, self.train_sec).examples_per_sec or 0.0


class AttemptLog:
    """`model_dir/attempts.json`: a JSON list of attempts, oldest first, rewritten atomically."""

    def __init__(self, model_dir: str):
        self.path = os.path.join(model_dir, FILE_NAME)
        self.attempts = self._read()
        self.current: Attempt | None = None

    def _read(self) -> list[Attempt]:
        """The recorded attempts. An unreadable file (garbled, or from another version) must not block the
        run it describes: it is kept aside as `attempts.json.unreadable` and the ledger starts afresh."""
        if not os.path.exists(self.path):
            return []
        try:
            with open(self.path) as f:
                return [Attempt(**record) for record in json.load(f)]
        except (ValueError, TypeError) as e:
            os.replace(self.path, self.path + ".unreadable")
            print(f"warning: {self.path} is unreadable ({e}); kept as {self.path}.unreadable", file=sys.stderr)
            return []

    def begin(self, resumed_from_step: int, job: SlurmJob | None) -> Attempt:
        """Records the start of this process's attempt, and the end of any earlier one still "running": with
        the run directory's lock held, it is not (SIGKILL, a lost node, an out-of-memory kill)."""
        for earlier in self.attempts:
            if earlier.outcome == RUNNING:
                earlier.outcome = requeue_lib.killed(earlier.step)
        attempt = Attempt(
            attempt=len(self.attempts) + 1,
            started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            host=socket.gethostname(),
            pid=os.getpid(),
            resumed_from_step=resumed_from_step,
            step=resumed_from_step,
        )
        if job is not None:
            attempt.slurm_job_id = job.job_id
            attempt.slurm_array_task = job.requeue_target if job.array_task_id else ""
            attempt.slurm_restart_count = job.restart_count
        self.current = attempt
        self.attempts.append(attempt)
        self._write()
        return attempt

    def progress(self, step: int, examples: int, train_sec: float) -> None:
        """Updates the current attempt at a checkpoint."""
        self.current.step, self.current.examples, self.current.train_sec = step, examples, train_sec
        self._write()

    def end(self, outcome: str) -> None:
        """Records how the current attempt ended (nothing when it never began: stopped before the resume)."""
        if self.current is not None:
            self.current.outcome = outcome
            self._write()

    def requeue_history(self, job_id: str) -> requeue_lib.History:
        """The requeues (time limit, lost task) of Slurm job `job_id` before the current attempt: all of them,
        and the latest ones in a row that checkpointed no newer step than they resumed from (any attempt of the
        job that did ends the row)."""
        earlier = [dataclasses.asdict(a) for a in self.attempts if a is not self.current]
        return requeue_lib.history(earlier, job_id)

    def examples_per_sec(self) -> float:
        """Over every attempt: examples trained / training seconds, both summed."""
        total = Rate()
        for a in self.attempts:
            total.add(Rate(a.examples, a.train_sec))
        return total.examples_per_sec or 0.0

    def summary(self) -> list[dict]:
        """Per-attempt figures for metrics.json."""
        return [{**dataclasses.asdict(a), "examples_per_sec": a.examples_per_sec} for a in self.attempts]

    def _write(self) -> None:
        """Rewrites the file. A failure (a full disk) is reported, never raised: the ledger must not mask the
        error that ends the run, nor end a run by itself."""
        try:
            report.write_json(self.path, [dataclasses.asdict(a) for a in self.attempts])
        except OSError as e:
            print(f"warning: could not write {self.path}: {e}", file=sys.stderr)


def after_stop(log: AttemptLog, stop: StopRequested, job: SlurmJob | None, max_requeues: int, train_steps: int) -> str:
    """Ends the attempt a stop signal interrupted; after a time-limit warning, requeues the Slurm job where
    that helps (`launch.job.requeue.decide`). Returns a line for the log saying what happens next."""
    outcome = f"stopped by signal {stop.signum} at step {stop.step}"
    if stop.signum not in TIME_LIMIT_SIGNALS:
        log.end(outcome)
        if job is None:
            return "rerun the same command to resume"
        return "under Slurm with --requeue, the scheduler requeues the job and it resumes from there"
    if log.current is None and job is not None:
        # Warned while starting, before the resume recorded the attempt: it is still one of the job's requeues
        # without progress, and must count against --max_requeues (unrecorded, a job whose start-up outlasts
        # the warning would requeue itself until Slurm's own cap).
        log.begin(log.attempts[-1].step if log.attempts else 0, job)
    started = log.current.resumed_from_step if log.current else None
    decision = requeue_lib.decide(
        job,
        max_requeues,
        log.requeue_history(job.job_id) if job else requeue_lib.History(),
        train_steps - stop.step if stop.step is not None else train_steps,
        stop.step - started if stop.step is not None and started is not None else 0,
        stop.signalled_while_training,
    )
    until = requeue_lib.deadline(os.environ)  # the job's end: the requeue must get through before it
    ended, line = requeue_lib.carry_out(decision, job, outcome, TIME_LIMIT_REQUEUED, "time-limit warning", until)
    log.end(ended)
    return line
