"""Time-limit requeue: the policy (launch.job.requeue.decide), and the trainer calling `scontrol requeue` for its
Slurm job after the warning signal, recorded in attempts.json (a fake scontrol stands in for Slurm here;
tests/launch/test_slurm_jobs.py does it on a real one)."""

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from launch.job import lost, requeue
from launch.job.cluster import SlurmJob, slurm_job
from trainer.loop.run import train
from trainer.outputs import attempts as attempts_lib
from trainer.system import stop as stop_lib

JOB = SlurmJob("101")


@pytest.mark.quick
@pytest.mark.parametrize(
    "job, history, steps_left, trained, while_training, expected",
    [
        (JOB, (0, 0), 50, 10, True, (True, "requeue 1, after 10 steps")),
        (JOB, (2, 0), 50, 10, True, (True, "requeue 3, after 10 steps")),
        (JOB, (9, 3), 50, 10, True, (True, "requeue 10, after 10 steps")),  # progress: never capped
        (JOB, (5, 2), 50, 0, False, (True, "requeue 6, without a step trained: 3 in a row of at most 3")),
        (JOB, (5, 3), 50, 0, False, (False, "already requeued itself 3 times in a row without a step trained")),
        (JOB, (0, 0), 0, 10, True, (False, "training is complete")),
        (JOB, (0, 0), 50, 0, True, (False, "no step finished between the start of training and the time-limit")),
        (None, (0, 0), 50, 10, True, (False, "not a Slurm job")),
    ],
)
def test_decide(job, history, steps_left, trained, while_training, expected):
    decision = requeue.decide(job, 3, requeue.History(*history), steps_left, trained, while_training)
    assert decision.requeue == expected[0] and expected[1] in decision.reason


def _attempt(number, job_id, resumed, step, outcome):
    return {"attempt": number, "started": "", "host": "h", "pid": number, "resumed_from_step": resumed,
            "slurm_job_id": job_id, "step": step, "outcome": outcome}  # fmt: skip


@pytest.mark.quick
def test_requeue_history_counts_the_latest_requeues_without_progress(tmp_path):
    requeued = attempts_lib.TIME_LIMIT_REQUEUED + " (...)"
    records = [
        _attempt(1, "7", 0, 10, requeued),
        _attempt(2, "7", 10, 10, requeued),  # warned while starting: no step
        _attempt(3, "7", 10, 25, requeued),  # progress ends the row
        _attempt(4, "7", 25, 25, requeued),
        _attempt(5, "8", 25, 25, requeued),  # another job's attempt
        _attempt(6, "7", 25, 25, "killed or lost (no end recorded; last checkpointed step 25)"),
        _attempt(7, "7", 25, 25, requeued),
    ]
    (tmp_path / "attempts.json").write_text(json.dumps(records))
    log = attempts_lib.AttemptLog(str(tmp_path))
    assert log.requeue_history("7") == requeue.History(requeues=5, without_progress=2)
    assert log.requeue_history("8") == requeue.History(requeues=1, without_progress=1)
    assert log.requeue_history("9") == requeue.History()


@pytest.mark.quick
def test_slurm_job_from_environment_and_array_target():
    assert slurm_job({}) is None
    job = slurm_job(
        {
            "SLURM_JOB_ID": "205",
            "SLURM_ARRAY_JOB_ID": "200",
            "SLURM_ARRAY_TASK_ID": "5",
            "SLURM_RESTART_COUNT": "2",
            "SLURMD_NODENAME": "node9",
        }
    )
    assert job == SlurmJob("205", "200", "5", 2, "node9")
    assert job.requeue_target == "200_5" and SlurmJob("7").requeue_target == "7"


class StopAfterChecks(stop_lib.StopRequest):
    """Becomes a stop by `signum` after `checks` looks at it (the loop looks once per step)."""

    def __init__(self, checks: int, signum: int):
        super().__init__()
        self.checks, self.stop_signum = checks, signum

    @property
    def requested(self) -> bool:
        self.checks -= 1
        if self.checks < 0 and not self.signals:
            self.handle(self.stop_signum)
        return bool(self.signals)


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """A Slurm array task's environment and an `scontrol` that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol-calls"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    for name, value in {"SLURM_JOB_ID": "305", "SLURM_ARRAY_JOB_ID": "300", "SLURM_ARRAY_TASK_ID": "5"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    return calls


def _attempts(tmp_path):
    return json.loads((tmp_path / "run" / "attempts.json").read_text())


def test_time_limit_warnings_requeue_every_attempt_that_trained_beyond_max_requeues(make_config, tmp_path, fake_slurm):
    config = make_config(loop={"train_steps": 40, "max_requeues": 0})
    for _ in range(2):  # each attempt trains 10 steps before its warning: both requeue, whatever --max_requeues
        with pytest.raises(stop_lib.StopRequested):
            train(config, stop=StopAfterChecks(8, signal.SIGUSR1))
    assert fake_slurm.read_text() == "requeue 300_5\n" * 2
    first, second = _attempts(tmp_path)
    # the loop looks at the stop between windows of 10 steps (--log_every_steps=10): the 8th look is at step 10
    assert first["slurm_job_id"] == "305" and first["slurm_array_task"] == "300_5" and first["step"] == 10
    assert first["outcome"].startswith("requeued for the time limit (requeue 1, after 10 steps)")
    assert (second["resumed_from_step"], second["step"]) == (10, 20)
    assert second["outcome"].startswith("requeued for the time limit (requeue 2, after 10 steps)")
    finished = train(config)
    assert finished["global_step"] == 40 and [a["attempt"] for a in finished["attempts"]] == [1, 2, 3]
    assert [(a["resumed_from_step"], a["step"]) for a in finished["attempts"]] == [(0, 10), (10, 20), (20, 40)]
    # timed examples: each start's steps of 64 but the one that traced the step's graph (one graph per start)
    assert [a["examples"] for a in finished["attempts"]] == [9 * 64, 9 * 64, 19 * 64]
    seconds = sum(a["train_sec"] for a in finished["attempts"])
    assert finished["examples_per_sec"] == pytest.approx(37 * 64 / seconds)  # over every attempt, not the last


def test_warnings_before_the_resume_are_requeues_without_progress_and_are_capped(make_config, tmp_path, fake_slurm):
    """A warning that lands while the trainer starts, before the resume records the attempt (a loaded machine's
    start-up outlasting the warning window), still makes an attempt of the job: recorded, and counted against
    --max_requeues, so such a job stops requeueing itself."""
    config = make_config(loop={"train_steps": 40, "max_requeues": 1})
    with pytest.raises(stop_lib.StopRequested):
        train(config, stop=StopAfterChecks(8, signal.SIGUSR1))  # trains 10 steps, requeued
    for _ in range(2):
        early = stop_lib.StopRequest()
        early.handle(signal.SIGUSR1)
        with pytest.raises(stop_lib.StopRequested, match="before the model was built"):
            train(config, stop=early)
    assert fake_slurm.read_text() == "requeue 300_5\n" * 2
    outcomes = [(a["resumed_from_step"], a["step"], a["outcome"]) for a in _attempts(tmp_path)]
    assert [o[:2] for o in outcomes] == [(0, 10), (10, 10), (10, 10)]
    assert outcomes[1][2].startswith("requeued for the time limit (requeue 2, without a step trained: 1 in a row")
    assert "not requeued: the job already requeued itself 1 times in a row" in outcomes[2][2]


@pytest.mark.quick
def test_examples_per_sec_is_over_every_attempt(tmp_path):
    """Examples and seconds are summed over the attempts: 4,000 examples in 7 s, not the mean of 1,000/s and
    500/s, nor the last attempt's 500/s."""
    (tmp_path / "attempts.json").write_text(
        json.dumps(
            [
                {"attempt": 1, "started": "", "host": "h", "pid": 1, "resumed_from_step": 0, "examples": 1000,
                 "train_sec": 1.0},
                {"attempt": 2, "started": "", "host": "h", "pid": 2, "resumed_from_step": 10, "examples": 3000,
                 "train_sec": 6.0},
            ]
        )
    )  # fmt: skip
    log = attempts_lib.AttemptLog(str(tmp_path))
    assert log.examples_per_sec() == pytest.approx(571.4285714)
    assert [a["examples_per_sec"] for a in log.summary()] == [1000.0, 500.0]


def test_preemption_is_left_to_slurm(make_config, tmp_path, fake_slurm):
    with pytest.raises(stop_lib.StopRequested):
        train(make_config(loop={"train_steps": 40}), stop=StopAfterChecks(8, signal.SIGTERM))
    assert not fake_slurm.exists()
    assert _attempts(tmp_path)[0]["outcome"].startswith("stopped by signal 15 at step")


def test_a_garbled_attempts_file_is_kept_aside_and_the_run_goes_on(make_config, tmp_path, capfd):
    train(make_config(loop={"train_steps": 2}))
    (tmp_path / "run" / "attempts.json").write_text('[{"attempt": 1, "garbled')
    resumed = train(make_config(loop={"train_steps": 4}))
    assert resumed["global_step"] == 4 and [a["resumed_from_step"] for a in resumed["attempts"]] == [2]
    assert (tmp_path / "run" / "attempts.json.unreadable").read_text() == '[{"attempt": 1, "garbled'
    assert "attempts.json is unreadable" in capfd.readouterr().err


@pytest.mark.quick
@pytest.mark.parametrize(
    "last, history, calls, line, outcome",
    [
        (("305", 500, 800, "lost a task: worker task 1 (n2:12001) has not answered"), [], 1,
         "a task was lost: job 300_5 requeued (requeue 1, after 300 steps)",
         "requeued after a lost task (requeue 1, after 300 steps); lost a task: worker task 1"),
        (("305", 500, 500, "running"), [("305", 500, 500, "requeued after a lost task (...)")], 1,
         "job 300_5 requeued (requeue 2, without a step trained: 2 in a row of at most 3)",
         "requeued after a lost task (requeue 2, without a step trained: 2 in a row of at most 3); killed or lost"),
        (("305", 500, 500, "failed: WorkerLost: lost worker task 1"), [("305", 500, 500, "requeued (...)")] * 3, 0,
         "a task was lost: not requeued: the job already requeued itself 3 times in a row",
         "failed: WorkerLost: lost worker task 1; not requeued: the job already requeued itself 3 times in a row"),
        (("305", 500, 800, "stopped by signal 15 at step 800"), [], 0, "nothing to requeue", "stopped by signal 15"),
        (("304", 500, 800, "running"), [], 0, "no attempt of this job in attempts.json", "running"),
    ],
)  # fmt: skip
def test_a_lost_task_requeues_the_job_by_the_rule_of_time_limits(
    tmp_path, fake_slurm, last, history, calls, line, outcome
):
    records = [_attempt(i + 1, *earlier) for i, earlier in enumerate(history)]
    records.append(_attempt(len(records) + 1, *last))
    (tmp_path / "attempts.json").write_text(json.dumps(records))
    said = lost.after_lost_task(str(tmp_path), slurm_job(os.environ), 3, until=4e9)
    assert line in said
    assert (fake_slurm.read_text() if fake_slurm.exists() else "") == "requeue 300_5\n" * calls
    assert _attempts_in(tmp_path)[-1]["outcome"].startswith(outcome)


def _attempts_in(directory):
    return json.loads((directory / "attempts.json").read_text())


def test_an_srun_that_outlives_the_chiefs_attempt_is_ended(tmp_path):
    """srun waiting for a task-exit message lost in an outage: killed `grace_sec` after the attempt ended."""
    srun = subprocess.Popen(["sleep", "60"])
    job = SlurmJob("305", restart_count=2)
    (tmp_path / "attempts.json").write_text(json.dumps([_attempt(1, "305", 0, 10, "running")]))
    started = time.monotonic()
    threading.Timer(1.0, lambda: (tmp_path / "attempts.json").write_text(
        json.dumps([{**_attempt(1, "305", 0, 10, "lost a task: ..."), "slurm_restart_count": 2}])
    )).start()  # fmt: skip
    lost.wait_for_srun(srun.pid, str(tmp_path), job, grace_sec=2.0)
    assert srun.wait(timeout=5) == -signal.SIGKILL
    assert 3.0 <= time.monotonic() - started < 8


@pytest.mark.quick
def test_an_srun_that_ends_by_itself_is_left_alone(tmp_path):
    srun = subprocess.Popen(["sleep", "1"])
    (tmp_path / "attempts.json").write_text(json.dumps([_attempt(1, "305", 0, 10, "lost a task: ...")]))
    lost.wait_for_srun(srun.pid, str(tmp_path), SlurmJob("999"), grace_sec=0.0)  # another job's attempt
    assert srun.wait(timeout=5) == 0
