"""What the local Slurm does, as the trainer's Slurm tests rely on it; every test prints what it measured.

python -m pytest -s -m slurm tests/launch/test_local_slurm.py
"""

import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
USR1_BEFORE_END_SEC = 25  # --signal=B:USR1@25 on a --time=1 job

# Attempt N (SLURM_RESTART_COUNT) writes started.N, and signal.N with the signal's name and time when SIGTERM
# or SIGUSR1 arrives, then exits 0. Attempt 0 waits for a signal; later attempts exit at once.
VICTIM_PY = """\
import os, signal, sys, time
attempt = os.environ.get("SLURM_RESTART_COUNT", "0")

def on_signal(signum, frame):
    with open(f"signal.{attempt}", "w") as f:
        f.write(f"{signal.Signals(signum).name} {time.time()}\\n")
    sys.exit(0)

signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGUSR1, on_signal)
with open(f"started.{attempt}", "w") as f:
    f.write(f"{time.time()}\\n")
if attempt == "0":
    time.sleep(300)
"""


def _victim(directory: Path) -> Path:
    """Writes victim.py and a batch script that `exec`s it (so Slurm signals python itself)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "victim.py").write_text(VICTIM_PY)
    return _script(directory / "victim.sh", f"exec {sys.executable} victim.py")


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def _wait_for_file(path: Path, timeout_sec: float = 60) -> str:
    deadline = time.monotonic() + timeout_sec
    while not path.exists() or not path.read_text().endswith("\n"):
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_sec} s"
        time.sleep(0.1)
    return path.read_text()


def _epoch(slurm_time: str) -> float:
    return time.mktime(time.strptime(slurm_time, "%Y-%m-%dT%H:%M:%S"))


@pytest.fixture(scope="module")
def usr1_job(local_slurm, tmp_path_factory):
    """A --time=1 --signal=B:USR1@25 job, submitted early so that it runs while the requeue test runs."""
    directory = tmp_path_factory.mktemp("usr1")
    args = ["--time=1", f"--signal=B:USR1@{USR1_BEFORE_END_SEC}", "-c1", "--output=%j.log", str(_victim(directory))]
    return local_slurm.sbatch(args, directory), directory


def test_exit_codes(local_slurm, tmp_path):
    jobs = {code: local_slurm.sbatch(["-c1", "--wrap", f"exit {code}"], tmp_path) for code in (0, 75, 130)}
    infos = {code: local_slurm.wait_for_state(job, FINISHED, 60) for code, job in jobs.items()}
    print({code: (info["JobState"], info["ExitCode"]) for code, info in infos.items()})
    assert (infos[0]["JobState"], infos[0]["ExitCode"]) == ("COMPLETED", "0:0")
    assert (infos[75]["JobState"], infos[75]["ExitCode"]) == ("FAILED", "75:0")
    assert (infos[130]["JobState"], infos[130]["ExitCode"]) == ("FAILED", "130:0")


def test_batch_environment(local_slurm, tmp_path):
    script = _script(
        tmp_path / "env.sh",
        """\
        env | grep ^SLURM | sort > batch.env
        srun -n1 bash -c 'env | grep ^SLURM | sort' > step.env
        scontrol show job -o "$SLURM_JOB_ID" > scontrol.out
        """,
    )
    job = local_slurm.sbatch(["--ntasks=2", str(script)], tmp_path)
    info = local_slurm.wait_for_state(job, FINISHED, 60)
    batch, step = ((tmp_path / name).read_text() for name in ("batch.env", "step.env"))
    print(f"--- batch step of --ntasks=2 ---\n{batch}--- srun -n1 step ---\n{step}")
    assert info["JobState"] == "COMPLETED", info
    assert f"SLURM_CONF={local_slurm.conf}\n" in batch
    assert f"JobId={job} " in (tmp_path / "scontrol.out").read_text()  # scontrol inside a job finds our slurmctld
    assert "SLURM_NTASKS=2\n" in batch and "SLURM_STEP_NUM_TASKS" not in batch
    assert "SLURM_NTASKS=1\n" in step and "SLURM_STEP_NUM_TASKS=1\n" in step


def test_slurm_conf_reaches_a_job_without_export(local_slurm, tmp_path):
    job = local_slurm.sbatch(["--export=NONE", "-c1", "--wrap", 'scontrol show job -o "$SLURM_JOB_ID" > out'], tmp_path)
    assert local_slurm.wait_for_state(job, FINISHED, 60)["JobState"] == "COMPLETED"
    assert f"JobId={job} " in (tmp_path / "out").read_text()  # slurmd itself sets SLURM_CONF in the job


def test_preemption_sends_sigterm_and_requeues(local_slurm, tmp_path):
    args = ["-p", "debug", "-c1", "--requeue", "--open-mode=append", "--output=%j.log", str(_victim(tmp_path))]
    victim = local_slurm.sbatch(args, tmp_path)
    _wait_for_file(tmp_path / "started.0")
    submitted = time.time()
    urgent = local_slurm.sbatch(["-p", "urgent", f"-c{local_slurm.cpus}", "--wrap", "sleep 1"], tmp_path)
    signal_name, signalled = _wait_for_file(tmp_path / "signal.0").split()
    restarted = float(_wait_for_file(tmp_path / "started.1"))
    info = local_slurm.wait_for_state(victim, FINISHED, 60)
    latency, restart_delay = float(signalled) - submitted, restarted - float(signalled)
    print(f"urgent submission -> SIGTERM {latency:.1f} s; SIGTERM -> victim restarted {restart_delay:.1f} s")
    assert signal_name == "SIGTERM"
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "1", "0:0")
    assert local_slurm.wait_for_state(urgent, FINISHED, 60)["JobState"] == "COMPLETED"
    assert latency < 10 and restart_delay < 20


def test_requeue_from_inside_the_job(local_slurm, tmp_path, usr1_job):
    script = _script(
        tmp_path / "requeue.sh",
        """\
        echo "attempt ${SLURM_RESTART_COUNT:-0} at $(date +%s.%N)"
        if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then scontrol requeue "$SLURM_JOB_ID"; sleep 60; fi
        echo "done"
        """,
    )
    job = local_slurm.sbatch(["-c1", "--requeue", "--open-mode=append", "--output=%j.log", str(script)], tmp_path)
    info = local_slurm.wait_for_state(job, FINISHED, 60)
    log = (tmp_path / f"{job}.log").read_text()
    times = [float(line.split()[-1]) for line in log.splitlines() if line.startswith("attempt ")]
    print(f"requeue delay {times[1] - times[0]:.1f} s between attempts\n{log}")
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "1", "0:0")
    assert [line.split()[1] for line in log.splitlines() if line.startswith("attempt ")] == ["0", "1"]
    assert log.rstrip().endswith("done") and times[1] - times[0] < 15


def test_usr1_arrives_between_end_minus_t_minus_30_and_end_minus_t(local_slurm, usr1_job):
    """The time limit's check runs every 30 s and fires as soon as now >= end - T - 30 s: never late, <= 30 s early."""
    job, directory = usr1_job
    signal_name, signalled = _wait_for_file(directory / "signal.0", timeout_sec=90).split()
    info = local_slurm.wait_for_state(job, FINISHED, 30)
    after_start = float(signalled) - _epoch(info["StartTime"])
    print(f"--time=1 --signal=B:USR1@{USR1_BEFORE_END_SEC}: USR1 {after_start:.1f} s after the start")
    assert signal_name == "SIGUSR1" and info["JobState"] == "COMPLETED"
    assert 60 - USR1_BEFORE_END_SEC - 30 - 2 <= after_start <= 60 - USR1_BEFORE_END_SEC + 2
