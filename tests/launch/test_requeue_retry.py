"""The requeue survives the moment it is needed in: `scontrol requeue` is retried with backoff while Slurm's
controller does not answer (the node that asks lost its network), until the job's end time; an answer no wait
can change is not retried. A fake `scontrol` on PATH answers with the real messages of Slurm 22.05, measured
on the two-node test Slurm with the chief's node cut off."""

import datetime
import json
import subprocess

import pytest

from launch.job import lost, requeue
from launch.job.cluster import SlurmJob
from launch.submit import sbatch

pytestmark = pytest.mark.quick

UNREACHABLE = "Unexpected message received for job 9"  # scontrol requeue, controller unreachable (22.05)
NO_CONTROLLER = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


@pytest.fixture
def fake_scontrol(tmp_path, monkeypatch):
    """`scontrol` failing its first N calls with a message, then succeeding (or, given `then`, failing with
    that message); its calls are counted."""

    def make(failures: int, message: str = UNREACHABLE, then: str | None = None):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        calls = tmp_path / "calls"
        script = f"""#!/bin/sh
echo "$@" >> {calls}
if [ "$(wc -l < {calls})" -le {failures} ]; then echo "{message}" >&2; exit 1; fi
""" + (f'echo "{then}" >&2; exit 1\n' if then else "")
        (bin_dir / "scontrol").write_text(script)
        (bin_dir / "scontrol").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
        return calls

    return make


class Clock:
    """A clock that only the sleeps move: the retry's waits are recorded, not waited."""

    def __init__(self, now: float = 1_000_000.0):
        self.now, self.slept = now, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _call(until_after: float, clock: Clock, said: list[str]) -> str:
    return requeue.call(["scontrol", "requeue", "9"], "requeue of job 9", clock.now + until_after, said.append,
                        clock.sleep, clock)  # fmt: skip


def test_a_requeue_is_retried_with_backoff_until_the_controller_answers(fake_scontrol):
    calls = fake_scontrol(7)
    clock, said = Clock(), []
    _call(3600, clock, said)
    assert calls.read_text() == "requeue 9\n" * 8
    assert clock.slept == [1, 2, 4, 8, 16, 30, 30]  # doubled, capped at 30 s
    until = datetime.datetime.fromtimestamp(clock.now - sum(clock.slept) + 3600).strftime("%H:%M:%S")
    assert said[2] == (
        f"requeue of job 9: no answer from Slurm's controller (exited 1: {UNREACHABLE}); trying again in 4 s "
        f"(until {until})"
    )
    assert len(said) == 7


def test_a_permanent_answer_is_not_retried(fake_scontrol):
    calls = fake_scontrol(99, "Requested operation is presently disabled for job 9")
    clock, said = Clock(), []
    with pytest.raises(requeue.RequeueError, match="presently disabled for job 9$"):
        _call(3600, clock, said)
    assert (calls.read_text(), clock.slept, said) == ("requeue 9\n", [], [])


def test_a_try_that_requeued_the_job_but_failed_is_a_requeue_done(fake_scontrol):
    """The requeue's SIGTERM to the job's steps ends `scontrol` too ("exited -15", on the three-node test Slurm);
    the next try is told the job is pending: requeued, not "requeue failed; resubmit" (which would start a
    second job on the same model_dir)."""
    calls = fake_scontrol(1, "", then="Job is pending execution for job 9")
    decision = requeue.Decision(True, "requeue 1, after 49 steps")
    outcome, line = requeue.carry_out(
        decision, SlurmJob("9"), "stopped by signal 10 at step 36", requeue.TIME_LIMIT_REQUEUED, "warned", 2e9
    )
    assert calls.read_text() == "requeue 9\n" * 2  # one retry, 1 s later
    assert outcome == "requeued for the time limit (requeue 1, after 49 steps); stopped by signal 10 at step 36"
    assert line == "warned: job 9 requeued (requeue 1, after 49 steps)"


def test_the_retry_stops_at_the_deadline(fake_scontrol):
    calls = fake_scontrol(99, NO_CONTROLLER)
    clock, said = Clock(), []
    with pytest.raises(
        requeue.RequeueError, match=r"connect failure\) \(6 tries up to the deadline, \d\d:\d\d:\d\d\)$"
    ):
        _call(40, clock, said)
    assert clock.slept == [1, 2, 4, 8, 16]  # 31 s slept; one more wait of 30 s would pass the 40 s
    assert calls.read_text().count("\n") == 6 and len(said) == 5


def test_the_deadline_is_the_jobs_end_time_or_an_hour():
    end = datetime.datetime(2026, 11, 26, 9, 30, 5)
    assert requeue.deadline({"TOWERFLOW_JOB_END_TIME": "2026-11-26T09:30:05"}, 0) == end.timestamp()
    assert requeue.deadline({"SLURM_JOB_END_TIME": "1800000000"}, 0) == 1800000000
    assert requeue.deadline({"TOWERFLOW_JOB_END_TIME": "NONE"}, 50) == 50 + requeue.DEFAULT_BUDGET_SEC  # no limit
    assert requeue.deadline({}, 50) == 50 + requeue.DEFAULT_BUDGET_SEC


def test_the_batch_script_exports_the_end_time_squeue_gives(tmp_path):
    """The line the script runs, with a fake squeue printing what Slurm 22.05's `squeue -h -o %e` prints."""
    spec = sbatch.JobSpec(str(tmp_path), (), "python3", str(tmp_path), nodes=2)
    line = next(s for s in sbatch.render(spec).splitlines() if s.startswith("export TOWERFLOW_JOB_END_TIME="))
    (tmp_path / "squeue").write_text('#!/bin/sh\n[ "$*" = "-h -j 9 -o %e" ] && echo 2026-11-26T09:30:05\n')
    (tmp_path / "squeue").chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_ID": "9"}
    done = subprocess.run(
        ["sh", "-c", f"{line}; echo $TOWERFLOW_JOB_END_TIME"], env=env, capture_output=True, text=True
    )
    assert done.stdout == "2026-11-26T09:30:05\n"


def _lost_attempt(tmp_path) -> None:
    record = {"attempt": 1, "slurm_job_id": "9", "resumed_from_step": 0, "step": 300, "slurm_restart_count": 0,
              "outcome": "lost a task: worker task 1 (tfn2:12001) has not answered for 9 s"}  # fmt: skip
    (tmp_path / "attempts.json").write_text(json.dumps([record]))


def test_the_batch_shell_requeues_once_the_controller_answers_and_says_so_meanwhile(tmp_path, fake_scontrol, capsys):
    fake_scontrol(2)
    _lost_attempt(tmp_path)
    line = lost.after_lost_task(str(tmp_path), SlurmJob("9"), 3, until=4e9)
    assert line == "a task was lost: job 9 requeued (requeue 1, after 300 steps)"
    waits = [s for s in capsys.readouterr().out.splitlines() if "no answer from Slurm's controller" in s]
    assert [w.split("trying again in ")[1][:4] for w in waits] == ["1 s ", "2 s "]
    assert waits[0].startswith("=== towerflow: requeue of job 9: no answer from Slurm's controller (exited 1: ")
    outcome = json.loads((tmp_path / "attempts.json").read_text())[0]["outcome"]
    assert outcome.startswith("requeued after a lost task (requeue 1, after 300 steps); lost a task: worker task 1")


def test_a_requeue_that_never_gets_through_says_what_to_do(tmp_path, fake_scontrol):
    fake_scontrol(99)
    _lost_attempt(tmp_path)
    line = lost.after_lost_task(str(tmp_path), SlurmJob("9"), 3, until=0)  # the job's time is up
    assert line == (
        f"a task was lost: requeue failed: scontrol requeue 9 exited 1: {UNREACHABLE} (1 try up to the "
        f"deadline, {datetime.datetime.fromtimestamp(0).strftime('%H:%M:%S')}). To go on, {requeue.RESUBMIT}."
    )
    outcome = json.loads((tmp_path / "attempts.json").read_text())[0]["outcome"]
    assert outcome.startswith("lost a task: worker task 1 (tfn2:12001) has not answered for 9 s; requeue failed: ")
