"""towerflow jobs on a real Slurm (tests/support/slurm_fixture.py brings up a one-node Slurm 22.05 with
proctrack/cgroup): submitted with `python -m launch.slurm`, they finish, survive `scontrol requeue`, a time
limit and a real preemption, and end with the weights of an uninterrupted run (`--deterministic`). Jobs of two
tasks (srun, one chief and one worker on the one node) train the weights of one process with two towers."""

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from launch.submit import slurm as launcher
from tests.support.holds import held, trainer_pids
from tests.support.paths import ROOT
from tests.support.runs import run_trainer

pytestmark = pytest.mark.slurm

# Each interruption is asked for while the job's trainer is held still at a step (tests/support/holds.py), so a
# job needs no length of its own to outlast the signal's arrival: 300 steps (the jobs were 5,000 steps, 50-65 s
# of training, so that a --time=1 job still trained when its warning came 15-45 s in; 18 attempts once; then
# 600 held at step 200: most of a job's CPU is its steps, not its starts).
TRAIN_STEPS = 300
HOLD_AT = 100
TRAINER_FLAGS = [
    "--device=cpu",
    "--num_gpus=2",
    "--micro_batches=4",
    "--global_batch_size=128",
    "--deterministic",
    "--seed=5",
    f"--train_steps={TRAIN_STEPS}",
    "--log_every_steps=50",
    "--eval_every_steps=0",
    "--checkpoint_every_steps=0",  # only the checkpoints a stop writes, and the final one
    "--histogram_every_steps=0",
    "--noexport",
]
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


@pytest.fixture(autouse=True)
def slurm_env(local_slurm, monkeypatch):
    """Slurm's commands (sbatch in the launcher, scontrol in the jobs) find the local controller."""
    for name, value in local_slurm.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    return local_slurm


def _submit(capsys, model_dir, *launcher_args, steps=TRAIN_STEPS) -> int:
    flags = [f if not f.startswith("--train_steps") else f"--train_steps={steps}" for f in TRAINER_FLAGS]
    assert launcher.main([f"--model_dir={model_dir}", "--cpus_per_task=1", *launcher_args, "--", *flags]) == 0
    out = capsys.readouterr().out
    return int(re.search(r"^submitted job (\d+)$", out, re.MULTILINE).group(1))


def _log(model_dir, job_id) -> str:
    path = os.path.join(model_dir, "slurm", f"towerflow-{os.path.basename(model_dir)}-{job_id}.log")
    return open(path).read() if os.path.exists(path) else ""


def _wait_for_log(model_dir, job_id, pattern, timeout_sec=180.0) -> str:
    deadline = time.monotonic() + timeout_sec
    while not re.search(pattern, log := _log(model_dir, job_id)):
        assert time.monotonic() < deadline, f"no {pattern!r} in the log after {timeout_sec} s:\n{log[-3000:]}"
        time.sleep(0.5)
    return log


def _metrics(model_dir) -> dict:
    with open(os.path.join(model_dir, "metrics.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def reference_sha256(tmp_path_factory):
    """The weights of the same flags trained uninterrupted, outside Slurm."""
    model_dir = tmp_path_factory.mktemp("reference") / "run"
    return _train_locally(model_dir, TRAINER_FLAGS)["weights_sha256"]


def _train_locally(model_dir, flags) -> dict:
    """Trains `flags` in one local process outside Slurm; returns its metrics.json."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = run_trainer(*flags, f"--model_dir={model_dir}", env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return _metrics(model_dir)


def _assert_resumed_exactly(slurm, job_id, model_dir, reference_sha256, every_attempt_trains=True) -> dict:
    info = slurm.wait_for_state(job_id, DONE, timeout_sec=540)
    log = _log(model_dir, job_id)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log[-3000:]
    assert int(info["Restarts"]) >= 1, f"finished without being interrupted: raise TRAIN_STEPS\n{log[-3000:]}"
    metrics = _metrics(model_dir)
    attempts = metrics["attempts"]
    assert len(attempts) == int(info["Restarts"]) + 1 and attempts[-1]["outcome"] == "finished"
    assert all(a["slurm_job_id"] == str(job_id) for a in attempts)
    for before, after in zip(attempts, attempts[1:], strict=False):
        assert after["resumed_from_step"] == before["step"] >= before["resumed_from_step"]
        assert before["step"] > before["resumed_from_step"] or not every_attempt_trains, attempts
    assert metrics["global_step"] == TRAIN_STEPS
    assert metrics["weights_sha256"] == reference_sha256
    assert log.count("=== towerflow: job") == len(attempts)  # one log, appended by every attempt
    return metrics


def test_a_short_job_finishes_and_names_its_job(capsys, slurm_env, tmp_path):
    model_dir = tmp_path / "short"
    job_id = _submit(capsys, model_dir, steps=100)
    info = slurm_env.wait_for_state(job_id, DONE, timeout_sec=300)
    log = _log(model_dir, job_id)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "0"), log[-3000:]
    assert re.search(rf"attempt 1 \(host .*slurm job {job_id}, restart 0.*\): fresh start at step 0", log)
    assert "step     100/100" in log
    metrics = _metrics(model_dir)
    assert metrics["global_step"] == 100 and metrics["examples_per_sec"] > 0
    assert [(a["slurm_job_id"], a["outcome"]) for a in metrics["attempts"]] == [(str(job_id), "finished")]


@pytest.fixture(scope="module")
def requeued_then_preempted(local_slurm, tmp_path_factory) -> tuple[int, str, int]:
    """One job for two tests: `scontrol requeue` at step 100 of its first attempt, then preempted by an urgent
    job 100 steps into its second, each asked for while the trainer is held at that step. Returns the job id,
    its model_dir and the urgent job's id."""
    model_dir = tmp_path_factory.mktemp("interrupted") / "run"
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as out:
        for name, value in {**local_slurm.env, "TF_CPP_MIN_LOG_LEVEL": "2"}.items():
            patch.setenv(name, value)  # sbatch and scontrol here, and the job (sbatch exports them)
        assert launcher.main([f"--model_dir={model_dir}", "--cpus_per_task=1", "--", *TRAINER_FLAGS]) == 0
        job_id = int(re.search(r"^submitted job (\d+)$", out.getvalue(), re.MULTILINE).group(1))
        _wait_for_log(model_dir, job_id, rf"step +{HOLD_AT}/")
        with held(trainer_pids(model_dir), signal.SIGTERM):
            subprocess.run(["scontrol", "requeue", str(job_id)], check=True, env=os.environ)
    log = _wait_for_log(model_dir, job_id, r"resumed from .* at step \d+")  # the second attempt (the first is fresh)
    resumed = int(re.search(r"resumed from .* at step (\d+)", log).group(1))
    _wait_for_log(model_dir, job_id, rf"step +{(resumed // 50) * 50 + HOLD_AT}/")
    urgent_log = f"--output={model_dir}.urgent.log"
    with held(trainer_pids(model_dir), signal.SIGTERM):
        urgent = local_slurm.sbatch(
            ["-p", "urgent", f"--cpus-per-task={local_slurm.cpus}", urgent_log, "--wrap", "sleep 2"],
            cwd=model_dir.parent,
        )
    return job_id, str(model_dir), urgent


def test_scontrol_requeue_mid_run_resumes_bitwise(slurm_env, requeued_then_preempted, reference_sha256):
    job_id, model_dir, _ = requeued_then_preempted
    metrics = _assert_resumed_exactly(slurm_env, job_id, model_dir, reference_sha256)
    log = _log(model_dir, job_id)
    stopped = int(re.search(r"stopped by SIGTERM at step (\d+); checkpoint .* saved", log).group(1))
    assert metrics["attempts"][0]["outcome"] == f"stopped by signal 15 at step {stopped}"
    assert metrics["attempts"][1]["resumed_from_step"] == stopped


def test_time_limit_requeues_itself_and_finishes_bitwise(capsys, slurm_env, tmp_path, reference_sha256):
    model_dir = tmp_path / "timelimit"
    # --time=1 with a 15 s warning: SIGUSR1 comes 15-45 s into every attempt (slurmctld checks every 30 s). The
    # trainer is held at step 100 until the warning is pending, so the first attempt that gets there trains and
    # is requeued. On a loaded machine an attempt's start-up can outlast the window (27 s once, in CI): that
    # attempt trains nothing and is requeued as one without progress, which --max_requeues=3 allows three times
    # in a row. A later attempt may be warned again before it ends: another requeue, counted the same way.
    job_id = _submit(capsys, model_dir, "--time=1", "--warning_sec=15")
    _wait_for_log(model_dir, job_id, rf"step +{HOLD_AT}/")
    with held(trainer_pids(model_dir), signal.SIGUSR1, timeout_sec=90):
        pass
    metrics = _assert_resumed_exactly(slurm_env, job_id, model_dir, reference_sha256, every_attempt_trains=False)
    requeued = [a for a in metrics["attempts"] if a["outcome"].startswith("requeued for the time limit")]
    assert len(requeued) == len(metrics["attempts"]) - 1 >= 1
    trained = [a for a in requeued if a["step"] > a["resumed_from_step"]]
    assert trained, metrics["attempts"]
    log = _log(model_dir, job_id)
    assert len(re.findall(rf"time-limit warning: job {job_id} requeued \(requeue \d+, after \d+ steps\)", log)) == len(
        trained
    )


def test_preemption_by_an_urgent_job_resumes_bitwise(slurm_env, requeued_then_preempted, reference_sha256):
    """The job's second attempt (after the requeue above) preempted: the urgent job runs, the job resumes."""
    job_id, model_dir, urgent = requeued_then_preempted
    metrics = _assert_resumed_exactly(slurm_env, job_id, model_dir, reference_sha256)
    assert slurm_env.job_info(urgent)["JobState"] == "COMPLETED"
    assert [a["outcome"].startswith("stopped by signal 15 at step") for a in metrics["attempts"]] == [True, True, False]


# Two tasks x 1 tower, K=2 micro-batches: the weights of one process with 2 towers and the same K.
TASK_FLAGS = [
    "--device=cpu",
    "--num_gpus=1",
    "--deterministic",
    "--micro_batches=2",
    "--seed=5",
    "--global_batch_size=64",
    "--eval_every_steps=0",
    "--histogram_every_steps=0",
    "--export=false",
    "--cluster_timeout_sec=120",
]
SHORT_STEPS = 12
# The requeue is asked for at step 80 while both tasks are held there (tests/support/holds.py): 160 steps leave
# 80 to train after the resume (600 steps did, for the SIGTERM to land mid-run by luck: 13-20 s more per run).
LONG_STEPS = 160


def _task_flags(steps: int, *extra: str) -> list[str]:
    return [*TASK_FLAGS, f"--train_steps={steps}", f"--log_every_steps={max(steps // 15, 1)}", *extra]


def _one_process_sha256(model_dir, flags: list[str]) -> str:
    """The weights of `flags` trained by one local process with --num_gpus=2 (outside Slurm)."""
    flags = [f if not f.startswith("--num_gpus") else "--num_gpus=2" for f in flags]
    metrics = _train_locally(model_dir, flags)
    assert (metrics["num_tasks"], metrics["num_towers"]) == (1, 2)
    return metrics["weights_sha256"]


@pytest.fixture(scope="module")
def short_reference_sha256(tmp_path_factory):
    return _one_process_sha256(tmp_path_factory.mktemp("short-ref") / "run", _task_flags(SHORT_STEPS))


def _submit_tasks(capsys, model_dir, steps, *launcher_args) -> int:
    argv = [f"--model_dir={model_dir}", "--cpus_per_task=1", "--tasks_per_node=2", *launcher_args]
    assert launcher.main([*argv, "--", *_task_flags(steps)]) == 0
    out = capsys.readouterr().out
    return int(re.search(r"^submitted job (\d+)$", out, re.MULTILINE).group(1))


def _assert_two_tasks_served_each_other(log: str, job_id: int, node: str, exit_code: int = 0) -> None:
    """Task 0 was the chief and task 1 its worker, on the ports derived from the job id (launch.job.cluster)."""
    base = 12000 + (job_id % 2500) * 8
    workers = f"workers {node}:{base}, {node}:{base + 1}"
    assert f"chief of task 0 of 2 (slurm job {job_id} step 0), {workers}" in log, log[-3000:]
    assert (
        f"task 1 of 2 (slurm job {job_id} step 0), {workers}: serving 1 cpu device(s) to the chief at {node}:{base}"
        in log
    ), log[-3000:]
    assert f"the chief at {node}:{base} ended the run with exit code {exit_code}; exiting with it" in log


def _assert_two_towers_on_two_tasks(model_dir, steps, reference_sha256) -> dict:
    metrics = _metrics(model_dir)
    assert (metrics["num_tasks"], metrics["num_towers"], metrics["towers_per_task"]) == (2, 2, 1)
    assert metrics["global_step"] == steps
    assert metrics["weights_sha256"] == reference_sha256
    return metrics


def test_two_tasks_on_one_node_train_the_weights_of_one_process_with_two_towers(
    capsys, slurm_env, tmp_path, short_reference_sha256
):
    model_dir = tmp_path / "tasks"
    job_id = _submit_tasks(capsys, model_dir, SHORT_STEPS)
    info = slurm_env.wait_for_state(job_id, DONE, timeout_sec=300)
    log = _log(model_dir, job_id)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "0"), log[-3000:]
    assert info["NumTasks"] == "2"
    _assert_two_tasks_served_each_other(log, job_id, slurm_env.node)
    assert re.search(rf"step +{SHORT_STEPS}/{SHORT_STEPS} ", log)
    metrics = _assert_two_towers_on_two_tasks(model_dir, SHORT_STEPS, short_reference_sha256)
    assert [(a["slurm_job_id"], a["outcome"]) for a in metrics["attempts"]] == [(str(job_id), "finished")]


def test_a_hand_written_srun_of_two_trains_the_same_weights_and_the_batch_step_is_one_process(
    slurm_env, tmp_path, short_reference_sha256
):
    """What a user would write: `#SBATCH --ntasks=2` and `srun python -m trainer`. The batch script itself is
    one process whatever the allocation's SLURM_NTASKS says: there, --num_gpus=2 trains alone."""
    srun_dir, batch_dir = tmp_path / "srun", tmp_path / "batch"
    flags = " ".join(_task_flags(SHORT_STEPS))
    script = tmp_path / "two-tasks.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --ntasks=2\n"
        f"#SBATCH --output={tmp_path}/two-tasks.log\n"
        f"srun {sys.executable} -u -m trainer {flags} --model_dir={srun_dir}\n"
        'echo "srun exit $?"\n'
        f"exec {sys.executable} -u -m trainer {flags.replace('--num_gpus=1', '--num_gpus=2')} --model_dir={batch_dir}\n"
    )
    job_id = slurm_env.sbatch([str(script)], cwd=ROOT)
    info = slurm_env.wait_for_state(job_id, DONE, timeout_sec=300)
    log = (tmp_path / "two-tasks.log").read_text()
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log[-3000:]
    assert "srun exit 0" in log
    _assert_two_tasks_served_each_other(log, job_id, slurm_env.node)
    _assert_two_towers_on_two_tasks(srun_dir, SHORT_STEPS, short_reference_sha256)
    batch = _metrics(batch_dir)
    assert (batch["num_tasks"], batch["num_towers"], batch["global_step"]) == (1, 2, SHORT_STEPS)
    assert batch["weights_sha256"] == short_reference_sha256


@pytest.fixture(scope="module")
def long_reference_sha256(tmp_path_factory):
    # Trained before the jobs that use it, not alongside: two trainings on 2 cores slow each other.
    return _one_process_sha256(tmp_path_factory.mktemp("long-ref") / "run", _task_flags(LONG_STEPS))


def test_two_tasks_requeued_mid_run_resume_bitwise(capsys, slurm_env, tmp_path, long_reference_sha256):
    """`scontrol requeue` (as a preemption does) sends SIGTERM to both tasks: the chief checkpoints after its
    step, both exit 75, and the restarted job resumes to the weights of an uninterrupted one-process run."""
    reference_sha256 = long_reference_sha256
    model_dir = tmp_path / "requeued"
    job_id = _submit_tasks(capsys, model_dir, LONG_STEPS)
    _wait_for_log(model_dir, job_id, rf"step +{LONG_STEPS // 2}/")
    with held(trainer_pids(model_dir), signal.SIGTERM):
        subprocess.run(["scontrol", "requeue", str(job_id)], check=True, env=os.environ)
    info = slurm_env.wait_for_state(job_id, DONE, timeout_sec=400)
    log = _log(model_dir, job_id)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log[-3000:]
    assert int(info["Restarts"]) == 1 and log.count("=== towerflow: job") == 2
    stopped = int(re.search(r"stopped by SIGTERM at step (\d+); checkpoint .* saved", log).group(1))
    first, second = log.split("=== towerflow: job")[1:]
    _assert_two_tasks_served_each_other(first, job_id, slurm_env.node, exit_code=75)
    _assert_two_tasks_served_each_other(second, job_id, slurm_env.node, exit_code=0)
    metrics = _assert_two_towers_on_two_tasks(model_dir, LONG_STEPS, reference_sha256)
    attempts = metrics["attempts"]
    assert [a["outcome"] for a in attempts] == [f"stopped by signal 15 at step {stopped}", "finished"]
    assert attempts[1]["resumed_from_step"] == stopped < LONG_STEPS
