"""Several machines, stood in for by processes on 127.0.0.1 with logical CPU devices (trainer.system.distributed).

The same weights for every layout of the same K micro-batches, after a kill of the whole job and after a
preemption; a dead worker ends the chief with a message naming it; workers leave with the chief's outcome.
"""

import json
import os
import re
import signal
import time

import pytest
import tensorflow as tf

from tests.support.cluster import Job, metrics, slurm_envs, tf_config_envs, train_tags
from tests.support.paths import ROOT
from tests.support.runs import run_trainer
from trainer.system import distributed

LAYOUT = ("--micro_batches=4", "--global_batch_size=64", "--train_steps=12", "--checkpoint_every_steps=3")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, 4 towers: the weights every layout must reproduce."""
    model_dir = tmp_path_factory.mktemp("reference") / "run"
    job = Job(model_dir, [{}], 4, *LAYOUT)
    assert job.wait() == [0], job.output(0)[-3000:]
    return metrics(model_dir)


@pytest.mark.parametrize("num_tasks, envs, placement", [(2, tf_config_envs, "cpu"), (4, slurm_envs, "gpu")])
def test_every_layout_trains_the_same_weights(tmp_path, reference, num_tasks, envs, placement):
    """K = 4 on 1 x 4 (the reference, variables on the CPU), 2 x 2 and 4 x 1 (variables on the first tower).
    A checkpoint every step: from its fifth save of a process on, TensorFlow's multi-task saver used to warn
    of retracing at every save."""
    flags = (*LAYOUT, f"--parameter_device={placement}", "--checkpoint_every_steps=1")
    job = Job(tmp_path / "run", envs(num_tasks), 4 // num_tasks, *flags)
    assert job.wait() == [0] * num_tasks, job.output(0)[-3000:]
    result = metrics(tmp_path / "run")
    assert result["weights_sha256"] == reference["weights_sha256"]
    assert (result["num_tasks"], result["num_towers"], result["towers_per_task"]) == (num_tasks, 4, 4 // num_tasks)
    assert result["global_step"] == 12
    assert result["eval_examples"] == reference["eval_examples"] == 360  # every eval example once
    assert result["eval_accuracy"] == reference["eval_accuracy"]
    for task in range(1, num_tasks):
        assert "ended the run with exit code 0; exiting with it" in job.output(task)
    assert f"chief of task 0 of {num_tasks}" in job.output(0)
    workers = re.search(r"chief of task 0 .*, workers (.+)", job.output(0)).group(1).split(", ")[1:]  # no chief
    assert not [w for w in workers if os.path.exists(distributed.status_path(w))]  # nothing left in /tmp
    for task in range(num_tasks):  # a healthy run prints no traceback ("Exception ignored in Executor.__del__")
        assert "Traceback" not in job.output(task) and "retracing" not in job.output(task), job.output(task)[-3000:]
        # nor TensorFlow's C++ E or W lines (TF_CPP_MIN_LOG_LEVEL=1 here): the known-harmless ones are kept out
        # (trainer.system.console.HARMLESS, docs/console.md)
        assert not re.findall(r"^[EW]\d{4} \d\d:\d\d:.*$", job.output(task), re.MULTILINE), job.output(task)[-3000:]
    per_task = 4 // num_tasks
    want = {f"tower_step_sec/task_{t}_cpu_{g}" for t in range(num_tasks) for g in range(per_task)}
    assert want <= train_tags(tmp_path / "run")  # TensorBoard names the towers by task and device


def test_six_micro_batches_train_the_same_weights_on_every_layout_and_placement(tmp_path):
    """K = 6 on 1 x 6, 2 x 3 (each task's block is two subtrees of the sum: two partial sums per task) and
    3 x 2, each with another parameter placement: one set of weights."""
    flags = ("--micro_batches=6", "--global_batch_size=48", "--train_steps=6", "--checkpoint_every_steps=0")
    hashes = {}
    for tasks, placement in [(1, "gpu"), (2, "spread"), (3, "cpu")]:
        envs = tf_config_envs(tasks) if tasks > 1 else [{}]
        job = Job(tmp_path / f"{tasks}x{6 // tasks}", envs, 6 // tasks, *flags, f"--parameter_device={placement}")
        assert job.wait() == [0] * tasks, job.output(0)[-3000:]
        result = metrics(tmp_path / f"{tasks}x{6 // tasks}")
        assert result["global_step"] == 6
        hashes[tasks, placement] = result["weights_sha256"]
    assert len(set(hashes.values())) == 1, hashes


def test_spread_variables_over_the_towers_of_every_task(tmp_path):
    """--parameter_device=spread owns variables on towers of both tasks; the weights are those of one task."""
    flags = (*LAYOUT, "--parameter_device=spread")
    one = Job(tmp_path / "one", [{}], 4, *flags)
    assert one.wait() == [0], one.output(0)[-3000:]
    two = Job(tmp_path / "two", tf_config_envs(2), 2, *flags)
    assert two.wait() == [0, 0], two.output(0)[-3000:]
    result = metrics(tmp_path / "two")
    assert result["weights_sha256"] == metrics(tmp_path / "one")["weights_sha256"]
    # the Dense kernel (87% of the bytes) is kept on both tasks, its gradient all-reduced; one task: none
    assert (result["mirrored_variables"], metrics(tmp_path / "one")["mirrored_variables"]) == (["dense1/kernel"], [])
    assert {d.split("/device:")[0] for d in result["parameter_devices"]} == {
        "/job:worker/replica:0/task:0",
        "/job:worker/replica:0/task:1",
    }


def test_whole_job_killed_then_resumed_on_another_layout_is_bitwise_the_same(tmp_path, reference):
    """Spread: the Dense kernel is mirrored on every task; its replicas (not checkpointed) are set from the
    restored variable and optimizer on the new layout."""
    flags = (*LAYOUT, "--parameter_device=spread")
    job = Job(tmp_path / "run", slurm_envs(2), 2, *flags)
    job.wait_for_step(7)
    job.kill()  # SIGKILL to every task, as a node failure or `scancel --signal=KILL` would
    rerun = Job(tmp_path / "run", slurm_envs(4), 1, *flags)  # 2 x 2 -> 4 x 1: the same K, the same sum
    assert rerun.wait() == [0] * 4, rerun.output(0)[-3000:]
    assert "resumed from" in rerun.output(0) and "at step 6" in rerun.output(0)
    assert metrics(tmp_path / "run")["weights_sha256"] == reference["weights_sha256"]


def test_sigterm_to_every_task_checkpoints_once_and_resumes_bitwise(tmp_path, reference):
    job = Job(tmp_path / "run", tf_config_envs(2), 2, *LAYOUT, "--checkpoint_every_steps=0")
    job.wait_for_step(4)
    for proc in job.procs:  # Slurm's preemption signals every task of the step
        proc.send_signal(signal.SIGTERM)
    assert job.wait(120) == [75, 75], job.output(0)[-3000:]
    stopped = [line for line in job.output(0).splitlines() if line.startswith("stopped by")]
    assert len(stopped) == 1 and "checkpoint" in stopped[0], job.output(0)[-2000:]
    checkpoints = tmp_path / "run" / "checkpoints"
    saved = sorted(f for f in os.listdir(checkpoints) if f.startswith("ckpt-") and f.endswith(".index"))
    assert len(saved) == 1  # the stop's checkpoint, from the chief alone
    assert "ended the run with exit code 75" in job.output(1)
    rerun = Job(tmp_path / "run", tf_config_envs(2), 2, *LAYOUT, "--checkpoint_every_steps=0")
    assert rerun.wait() == [0, 0], rerun.output(0)[-3000:]
    assert metrics(tmp_path / "run")["weights_sha256"] == reference["weights_sha256"]


def test_a_killed_chief_ends_its_workers(tmp_path):
    # --intra_op_threads: a runtime option reaches the chief of several tasks (it was refused there: joining the
    # cluster had started TensorFlow's devices before the run applied it).
    flags = ("--micro_batches=3", "--global_batch_size=63", "--train_steps=100000", "--intra_op_threads=1")
    job = Job(tmp_path / "run", tf_config_envs(3), 1, *flags)
    job.wait_for_step(2)
    job.procs[0].kill()
    killed = time.monotonic()
    assert job.wait(60)[1:] == [75, 75]  # resumable: the chief's last checkpoint is whole
    assert time.monotonic() - killed < 15  # a closed port ends them in seconds, not --peer_timeout_sec (60)
    chief = re.search(r"workers (\S+),", job.output(0)).group(1)
    assert f"error: the chief (task 0, {chief}) is gone: nothing listens at {chief} any more" in job.output(2)


def test_a_worker_frozen_shorter_than_the_peer_timeout_is_ridden_out(tmp_path, reference):
    job = Job(tmp_path / "run", tf_config_envs(2), 2, *LAYOUT, "--peer_timeout_sec=12")
    job.wait_for_step(4)
    job.procs[1].send_signal(signal.SIGSTOP)  # a node swapping, a hung driver: its port stays open
    time.sleep(5)
    job.procs[1].send_signal(signal.SIGCONT)
    assert job.wait() == [0, 0], job.output(0)[-3000:]
    assert not [line for line in (job.output(0) + job.output(1)).splitlines() if line.startswith("error")]
    assert metrics(tmp_path / "run")["weights_sha256"] == reference["weights_sha256"]


def test_a_worker_frozen_for_good_ends_every_task_with_75_naming_it_and_a_rerun_resumes(tmp_path, reference):
    envs = tf_config_envs(2)
    worker = json.loads(envs[1]["TF_CONFIG"])["cluster"]["worker"][1]
    job = Job(tmp_path / "run", envs, 2, *LAYOUT, "--peer_timeout_sec=6")
    job.wait_for_step(4)
    job.procs[1].send_signal(signal.SIGSTOP)
    frozen = time.monotonic()
    job.procs[0].send_signal(signal.SIGTERM)  # the step in progress never ends: acted on within the timeout
    assert job.procs[0].wait(timeout=60) == 75, job.output(0)[-3000:]
    assert time.monotonic() - frozen < 6 + 8  # the timeout, a probe's 2 s, and slack for a loaded machine
    assert f"error: worker task 1 ({worker}) has not answered for " in job.output(0)
    assert "its machine is unreachable or its process frozen; ending this attempt with 75" in job.output(0)
    with open(tmp_path / "run" / "attempts.json") as f:
        assert json.load(f)[-1]["outcome"].startswith(f"lost a task: worker task 1 ({worker}) has not answered")
    job.procs[1].send_signal(signal.SIGCONT)  # back, it finds its chief gone
    assert job.procs[1].wait(timeout=30) == 75
    rerun = Job(tmp_path / "run", tf_config_envs(2), 2, *LAYOUT)
    assert rerun.wait() == [0, 0], rerun.output(0)[-3000:]
    assert metrics(tmp_path / "run")["weights_sha256"] == reference["weights_sha256"]


def test_a_dead_worker_ends_the_chief_naming_it_and_a_rerun_resumes(tmp_path):
    flags = ("--micro_batches=2", "--train_steps=100000", "--checkpoint_every_steps=2")
    envs = tf_config_envs(2)
    worker = json.loads(envs[1]["TF_CONFIG"])["cluster"]["worker"][1]
    job = Job(tmp_path / "run", envs, 1, *flags)
    job.wait_for_step(5)
    killed = time.monotonic()
    job.procs[1].kill()
    code = job.procs[0].wait(timeout=90)
    ended_after = time.monotonic() - killed
    assert code == 75, (code, job.output(0)[-3000:])  # resumable: the last checkpoint is whole
    assert ended_after < 20
    assert f"worker task 1 ({worker})" in job.output(0)
    with open(tmp_path / "run" / "attempts.json") as f:  # the failed step's error, or the watch's
        assert json.load(f)[-1]["outcome"].startswith(("failed: WorkerLost: lost worker task 1", "lost a task: "))
    checkpoints = tmp_path / "run" / "checkpoints"
    saved = max(int(f[5:-6]) for f in os.listdir(checkpoints) if f.startswith("ckpt-") and f.endswith(".index"))
    rerun = Job(tmp_path / "run", tf_config_envs(2), 1, *flags[:1], f"--train_steps={saved + 2}")
    assert rerun.wait() == [0, 0], rerun.output(0)[-3000:]
    assert f"at step {saved}" in rerun.output(0)
    assert metrics(tmp_path / "run")["global_step"] == saved + 2


def test_workers_leave_with_the_chiefs_failure(tmp_path):
    """The chief fails on bad data after connecting; the worker must not wait for the time limit."""
    flags = ("--train_data=/nonexistent/train-*", "--eval_data=/nonexistent/eval-*", "--num_classes=10")
    job = Job(tmp_path / "run", tf_config_envs(2), 1, *flags)
    assert job.wait(120) == [2, 2]
    assert "no files match --train_data" in job.output(0)
    assert "ended the run with exit code 2; exiting with it" in job.output(1)


CPU_CGROUP = "/sys/fs/cgroup/cpu"  # cgroup v1's cpu controller, as on this project's machines and CI


@pytest.mark.skipif(not os.access(CPU_CGROUP, os.W_OK), reason=f"needs a writable {CPU_CGROUP} (root, cgroup v1)")
def test_a_task_with_less_cpu_is_named_slow_on_the_log_lines(tmp_path):
    """The worker held to 10% of a CPU by a cgroup quota (a node with a busy neighbour): the chief's log lines
    name task 1 as slow, never task 0, and the run finishes (TensorBoard's step time per task's tower: the
    layout test above)."""
    group = os.path.join(CPU_CGROUP, f"towerflow-test-{os.getpid()}")
    os.makedirs(group)
    try:
        with open(os.path.join(group, "cpu.cfs_quota_us"), "w") as f:
            f.write("10000")  # of the 100 ms period
        # 120 steps: the quota is on from step ~20, so the looks at steps 40 to 120 see task 1 slow, and a task
        # is named from its second slow look on (trainer.outputs.progress.Stragglers): four namings are expected
        flags = ("--micro_batches=4", "--global_batch_size=64", "--train_steps=120", "--log_every_steps=20")
        job = Job(tmp_path / "run", tf_config_envs(2), 2, *flags)
        job.wait_for_step(20)
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(job.procs[1].pid))
        assert job.wait() == [0, 0], job.output(0)[-3000:]
    finally:
        os.rmdir(group)
    named = re.findall(r"\(task (\d) is slow: [0-9.e-]+ s a step, the other tasks [0-9.e-]+ s\)$", job.output(0), re.M)
    assert named and set(named) == {"1"}, job.output(0)[-3000:]


def test_async_across_two_tasks_reports_staleness(tmp_path):
    job = Job(tmp_path / "run", slurm_envs(2), 1, "--update_mode=async", "--nodeterministic", "--train_steps=60")
    assert job.wait() == [0, 0], job.output(0)[-3000:]
    result = metrics(tmp_path / "run")
    assert (result["num_tasks"], result["num_towers"], result["global_step"]) == (2, 2, 60)
    assert result["staleness_updates"] == 60 and 0 <= result["staleness_mean"] <= result["staleness_max"] <= 2
    assert result["eval_accuracy"] > 0.5


def test_a_bad_cluster_is_refused_before_tensorflow_loads(tmp_path):
    """A `tensorflow` that fails to import shadows the real one: the refusal must come before any import of it."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text("raise ImportError('tensorflow was imported')\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT]),
        "TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"index": 3}}),
    }
    model_dir_flag = f"--model_dir={tmp_path / 'run'}"
    done = run_trainer(model_dir_flag, env=env, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "index" in done.stderr and "3" in done.stderr
    assert "tensorflow was imported" not in done.stderr
    # the same shadowed tensorflow with a valid cluster does get imported: the check above can fail
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})
    imported = run_trainer(model_dir_flag, env=env, timeout=120)
    assert "tensorflow was imported" in imported.stderr, imported.stderr[-3000:]


@pytest.mark.quick
@pytest.mark.parametrize(
    "text, said",
    [
        (
            'Graph execution error:\n\nDetected at node x\n:UNKNOWN:Error received from peer  {grpc_message:"Socket '
            'closed", grpc_status:14}',
            "Socket closed",
        ),
        ("Graph execution error:.\nThis could happen if the remote target has been disconnected from the client.",
         "This could happen if the remote target has been disconnected from the client."),
        ("", "UnavailableError"),
    ],
)  # fmt: skip
def test_a_lost_workers_message_says_what_failed_not_tensorflows_header(text, said):
    assert distributed.cause(tf.errors.UnavailableError(None, None, text)) == said
