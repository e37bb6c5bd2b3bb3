"""A towerflow job on two real Slurm nodes (tests/support/node_fixture.py: launch/testslurm/node_slurm.py, two slurmd in
network namespaces of their own on one bridge). Submitted as a user does, `python -m launch.slurm --nodes=2`,
one task per node with two towers each (K = 4 micro-batches: 2 tasks x 2 towers), it completes, each task on
its node, the tasks finding each other by node name, and it trains the weights of one process with 4 towers."""

import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from launch.testslurm import node_slurm as node_lib
from launch.testslurm import slurm_daemons
from tests.support.cluster import Job, metrics, slurm_task_pid
from tests.support.holds import stopped, trainer_pids
from tests.support.node_jobs import (
    DONE,
    attempts_in_log,
    log_of,
    submit,
    wait_for_step_of_restart,
    wait_for_steps_past_resume,
)

pytestmark = pytest.mark.twonode

# ~12 ms a step across the two nodes on 2 cores; most of a job's CPU is its steps (a 600-step task took ~25 CPU-s,
# a 400-step one ~18). The faults come at step 75 to 300, each at a step the test sees in the log: a
# kill or a freeze at once, a network cut while the tasks are held still (tests/support/holds.py), so that no
# fault needs training after it to land mid-run (the jobs were 1,200 steps for that, then 600).
STEPS = 400
LAYOUT = ("--micro_batches=4", "--global_batch_size=64", f"--train_steps={STEPS}", "--seed=5", "--log_every_steps=50")


@pytest.fixture(scope="module")
def one_process_sha256(tmp_path_factory):
    """The weights of the same flags and K trained by one process with 4 towers, outside Slurm (first: never
    beside a job, on 2 cores)."""
    model_dir = tmp_path_factory.mktemp("one-process") / "run"
    job = Job(model_dir, [{}], 4, *LAYOUT)
    assert job.wait() == [0], job.output(0)[-3000:]
    return metrics(model_dir)["weights_sha256"]


def _submit(slurm, model_dir, layout=LAYOUT, nodes="2") -> int:
    """`python -m launch.slurm --nodes=2 ...` (two towers per task) in a shell of the two-node Slurm; the job id."""
    return submit(slurm, model_dir, layout, nodes)


@dataclasses.dataclass(frozen=True)
class EndedJob:
    job_id: int
    info: dict[str, str]  # `scontrol show job` once it ended: no accounting (no slurmdbd), so sacct cannot say
    log: str
    metrics: dict


@pytest.fixture(scope="module")
def short_outage_job(node_slurm, tmp_path_factory, one_process_sha256) -> EndedJob:
    """One job for two tests: `--nodes=2`, tfn2's link down for 10 s mid-run (--peer_timeout_sec is 60), the
    model cut into 2 pipeline stages on each node's two devices (a pipeline per node, data parallel between
    them: docs/pipelines.md), which trains the weights of one process without stages."""
    slurm = node_slurm(2)
    model_dir = tmp_path_factory.mktemp("two-nodes") / "run"
    job_id = _submit_and_cut(slurm, model_dir, 10.0, "--pipeline_stages=2")
    info = slurm.wait_for_state(job_id, DONE, timeout_sec=240)
    return EndedJob(job_id, info, log_of(model_dir, job_id), metrics(model_dir))


def test_a_job_on_two_nodes_completes_with_the_weights_of_one_process(short_outage_job, one_process_sha256):
    job_id, info, log, result = dataclasses.astuple(short_outage_job)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "0"), log[-3000:]
    assert (info["NumNodes"], info["NumTasks"], info["NodeList"]) == ("2", "2", "tfn[1-2]")
    assert f"=== towerflow: job {job_id} restart 0 on tfn1 at" in log  # the batch step, on the first node
    port = 12000 + (job_id % 2500) * 8  # launch.job.cluster's derived port: local task 0 on each node
    workers = f"workers tfn1:{port}, tfn2:{port}"
    assert f"chief of task 0 of 2 (slurm job {job_id} step 0), {workers}" in log, log[-3000:]
    assert f"task 1 of 2 (slurm job {job_id} step 0), {workers}: serving 2 cpu device(s) to the chief" in log
    assert f"the chief at tfn1:{port} ended the run with exit code 0; exiting with it" in log
    assert not _tensorflow_warnings(log), log[-3000:]  # the harmless ones kept out (trainer.system.console)
    assert (result["num_tasks"], result["num_towers"], result["towers_per_task"]) == (2, 4, 2)
    pipeline = result["pipeline"]  # stages within a node, pipelines across the nodes
    pieces = ["conv1..bn2", "relu2..logits"]  # dense1 holds most bytes
    assert (pipeline["stages"], pipeline["pipelines"], pipeline["stage_pieces"]) == (2, 2, pieces)
    assert result["global_step"] == STEPS
    assert result["weights_sha256"] == one_process_sha256


def _tensorflow_warnings(log: str) -> list[str]:
    """TensorFlow's C++ E and W lines in a job's log (srun's `--label` before each)."""
    return re.findall(r"^(?:\d+: )?[EW]\d{4} \d\d:\d\d:.*$", log, re.MULTILINE)


def _tfn1_reaches_tfn2_slurmd() -> bool:
    """Whether a TCP connection from inside tfn1 to tfn2's slurmd opens, by node name (tfn1's /etc/hosts)."""
    connect = f"import socket; socket.create_connection(('tfn2', {node_lib.SITE.ports[1]}), timeout=1).close()"
    probe = ["ip", "netns", "exec", "tfn1", sys.executable, "-c", connect]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


def test_cut_takes_a_nodes_link_down_for_that_long_only(two_node_slurm):
    """What the fault tests will rely on: during `cut`, nothing gets from one node to the other; after it,
    the link is back by itself."""
    assert _tfn1_reaches_tfn2_slurmd()
    outage = threading.Thread(target=two_node_slurm.cut, args=("tfn2", 3.0))
    started = time.monotonic()
    outage.start()
    while " DOWN " not in node_lib.NET.link(2):  # `ip` runs in the thread: late on a loaded machine
        assert time.monotonic() - started < 2.5, node_lib.NET.link(2)
        time.sleep(0.05)
    assert not _tfn1_reaches_tfn2_slurmd()
    outage.join()
    assert 3.0 <= time.monotonic() - started < 10
    assert " UP " in node_lib.NET.link(2) and _tfn1_reaches_tfn2_slurmd()


def _submit_and_cut(slurm, model_dir, seconds: float, *extra: str) -> int:
    """Submits the job and, once it trains (step 150 to 300), takes tfn2's link down for `seconds`: the tasks
    are held still until the link is down, so the cut comes before the job's end on any machine."""
    job_id = _submit(slurm, model_dir, (*LAYOUT, *extra))
    _wait_for_log(model_dir, job_id, r"^0: step +(150|200|250|300)/", 120)
    outage = threading.Thread(target=slurm.cut, args=("tfn2", seconds))
    with stopped(trainer_pids(model_dir)):
        outage.start()
        _wait_until_down(2)
    outage.join()
    return job_id


def _wait_until_down(node: int) -> None:
    deadline = time.monotonic() + 60
    while " DOWN " not in node_lib.NET.link(node):
        assert time.monotonic() < deadline, node_lib.NET.link(node)
        time.sleep(0.05)


def test_a_network_outage_shorter_than_the_peer_timeout_is_ridden_out(short_outage_job, one_process_sha256):
    """tfn2's link down for 10 s mid-run (--peer_timeout_sec is 60): nothing ends, the step goes on once
    packets flow again, and the job completes in its first attempt with the weights of one process."""
    job_id, info, log, result = dataclasses.astuple(short_outage_job)
    first_attempt = log.split(f"=== towerflow: job {job_id} restart 1 on ")[0]  # how it ended, if it did
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "0"), first_attempt[-3000:]
    assert not re.search(r"^\d: error", log, re.MULTILINE), log[-3000:]
    assert [a["outcome"] for a in result["attempts"]] == ["finished"]
    assert result["weights_sha256"] == one_process_sha256


@pytest.fixture(scope="module")
def faulted_job(node_slurm, tmp_path_factory, one_process_sha256) -> EndedJob:
    """One job for two tests, four faults, one per attempt (--peer_timeout_sec=8, a checkpoint every 70 steps,
    --max_requeues=1): tfn2's link down for 25 s, then tfn2's task SIGKILLed, then SIGSTOPped for good, then the
    chief (on tfn1) SIGKILLed. Each fault comes 75 steps after the step its attempt resumed from (the cut with
    the tasks held still: tests/support/holds.py), so every attempt has checkpointed new steps before it (none
    is capped), and the last one at step 285 (the log says every 5th step), 115 before the end. The
    metrics' `recovered`: for each kill, the lost-task requeues in the log once the next attempt trained a step,
    and the seconds that took."""
    slurm = node_slurm(2)
    model_dir = tmp_path_factory.mktemp("faults") / "run"
    flags = (
        *LAYOUT,
        "--peer_timeout_sec=8",
        "--checkpoint_every_steps=70",
        "--max_requeues=1",
        "--log_every_steps=5",
    )
    job_id = _submit(slurm, model_dir, flags)
    kills = [(1, signal.SIGKILL), (1, signal.SIGSTOP), (0, signal.SIGKILL)]
    recovered = []
    try:
        wait_for_steps_past_resume(model_dir, job_id, 0, FAULT_AFTER_STEPS)
        outage = threading.Thread(target=slurm.cut, args=("tfn2", 25.0))
        with stopped(trainer_pids(model_dir)):
            outage.start()
            _wait_until_down(2)
        outage.join()
        for restart, (task, fault) in enumerate(kills, start=1):
            wait_for_steps_past_resume(model_dir, job_id, restart, FAULT_AFTER_STEPS)
            os.kill(slurm_task_pid(job_id, task), fault)
            faulted = time.monotonic()
            wait_for_step_of_restart(model_dir, job_id, restart + 1, 1)
            ended = re.findall(r"=== towerflow: a task was lost: job \d+ requeued", log_of(model_dir, job_id))
            recovered.append((len(ended), time.monotonic() - faulted))
        info = slurm.wait_for_state(job_id, DONE, timeout_sec=300)
    finally:  # a failure here must not leave the job running into the next test
        slurm_daemons.run(["scancel", str(job_id)], slurm.env, check=False)
    return EndedJob(job_id, info, log_of(model_dir, job_id), {**metrics(model_dir), "recovered": recovered})


# Each fault of `faulted_job` comes this many steps after its attempt's resume: past a checkpoint (every 70)
FAULT_AFTER_STEPS = 75


def test_a_longer_outage_ends_every_task_and_the_job_requeues_itself_and_finishes(faulted_job, one_process_sha256):
    """tfn2's link down for 25 s with --peer_timeout_sec=8 (the first attempt of `faulted_job`): each task ends
    with 75 naming the other; tfn2's task-exit message is lost, so the batch shell ends the waiting srun and
    requeues the job, which resumes and finishes with the weights of one process."""
    job_id, info, log, result = dataclasses.astuple(faulted_job)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "4"), log[-3000:]
    first_attempt = attempts_in_log(log, job_id)[0]
    port = 12000 + (job_id % 2500) * 8
    assert f"0: error: worker task 1 (tfn2:{port}) has not answered for " in first_attempt, first_attempt[-3000:]
    assert f"1: error: the chief (task 0, tfn1:{port}) has not answered for " in first_attempt
    assert "=== towerflow: a task was lost: job" in first_attempt
    first, second = result["attempts"][:2]
    assert first["outcome"].startswith("requeued after a lost task") and second["resumed_from_step"] == first["step"]
    assert result["attempts"][-1]["outcome"] == "finished"
    assert result["weights_sha256"] == one_process_sha256


def _wait_for_log(model_dir, job_id: int, pattern: str, timeout_sec: float) -> re.Match:
    """Until the job's log matches `pattern` (re.MULTILINE); the match."""
    deadline = time.monotonic() + timeout_sec
    while not (found := re.search(pattern, log_of(model_dir, job_id), re.MULTILINE)):
        assert time.monotonic() < deadline, log_of(model_dir, job_id)[-3000:]
        time.sleep(0.2)
    return found


def test_a_cut_of_the_chiefs_node_past_the_first_requeue_is_ridden_out_and_the_job_finishes(
    two_node_slurm, tmp_path, one_process_sha256
):
    """tfn1's link down (the chief's node, where the batch shell runs) with --peer_timeout_sec=8: each task
    ends with 75 naming the other, the batch shell ends the waiting srun 30 s later and asks for the requeue
    while tfn1 still cannot reach the controller. The link stays down until two tries have failed; the next one gets
    through, and the job comes back by itself and finishes with the weights of one process."""
    model_dir = tmp_path / "chief-outage"
    flags = (*LAYOUT, "--peer_timeout_sec=8", "--checkpoint_every_steps=125")
    job_id = _submit(two_node_slurm, model_dir, flags)
    _wait_for_log(model_dir, job_id, r"^0: step +(150|200|250|300)/", 120)  # a checkpoint at 125: progress to requeue
    unanswered = rf"^=== towerflow: requeue of job {job_id}: no answer from Slurm's controller \(exited 1: (.*)\);"
    with stopped(trainer_pids(model_dir)):  # the link down before the job can end
        node_lib.NET.set_link(1, up=False)
    cut = time.monotonic()
    try:
        first = _wait_for_log(model_dir, job_id, unanswered, 150)
        tried = time.monotonic() - cut
        _wait_for_log(model_dir, job_id, unanswered + "(.|\n)*" + unanswered, 120)  # the second try failed too
    finally:
        node_lib.NET.set_link(1, up=True)
    outage = time.monotonic() - cut
    _wait_for_log(model_dir, job_id, rf"^=== towerflow: job {job_id} restart 1 on ", 120)
    restarted = time.monotonic() - cut
    info = two_node_slurm.wait_for_state(job_id, DONE, timeout_sec=300)
    log = log_of(model_dir, job_id)
    print(f"tfn1 cut {outage:.0f} s (first requeue try failed at {tried:.0f} s); restart {restarted:.0f} s, "
          f"done {time.monotonic() - cut:.0f} s after the cut")  # fmt: skip
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), log[-3000:]
    assert first[1] == f"Unexpected message received for job {job_id}"  # what 22.05 says when unreachable
    port = 12000 + (job_id % 2500) * 8
    # tfn2's task said so too, but through srun on tfn1, out of reach: its line never reaches the log
    assert f"0: error: worker task 1 (tfn2:{port}) has not answered for " in log
    assert f"=== towerflow: a task was lost: job {job_id} requeued (requeue 1, after " in log
    first, second = metrics(model_dir)["attempts"]
    assert first["outcome"].startswith("requeued after a lost task (requeue 1, after "), first["outcome"]
    assert f"lost a task: worker task 1 (tfn2:{port}) has not answered for " in first["outcome"]
    assert (second["resumed_from_step"], second["outcome"]) == (first["step"], "finished")
    assert metrics(model_dir)["weights_sha256"] == one_process_sha256
    assert not _tensorflow_warnings(log), log[-3000:]


def test_a_killed_worker_a_frozen_worker_and_a_killed_chief_each_requeue_the_job_which_finishes_bitwise(
    faulted_job, one_process_sha256
):
    """After the outage (`faulted_job`'s first attempt), the job meets three more faults, one per attempt:
    tfn2's task SIGKILLed, then SIGSTOPped for good, then the chief (on tfn1) SIGKILLed. Each ends every task
    and the attempt within --peer_timeout_sec (8) plus a margin, the job requeues itself, and the fifth attempt
    finishes with the weights of one process. Four requeues with --max_requeues=1: each attempt checkpointed new
    steps, so none is capped."""
    job_id, info, log, result = dataclasses.astuple(faulted_job)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "4"), log[-3000:]
    for fault, (ended, seconds) in enumerate(result["recovered"], start=2):
        assert ended == fault  # the kill ended the attempt as a lost task, requeued
        # the timeout, probes, srun's kill, the 6 s requeue hold and a start with its first step, traced
        # on 2 cores that the other test process loads (97 s seen beside the full suite)
        assert seconds < 8 + 150, log[-3000:]
    port = 12000 + (job_id % 2500) * 8
    frozen = attempts_in_log(log, job_id)[2]
    assert f"0: error: worker task 1 (tfn2:{port}) has not answered for " in frozen, frozen[-3000:]
    outcomes = [a["outcome"] for a in result["attempts"]]
    assert all(o.startswith("requeued after a lost task (requeue") for o in outcomes[:4]) and outcomes[4] == "finished"
    assert "killed or lost (no end recorded" in outcomes[3]  # the chief killed: recorded by the batch shell
    resumed = [a["resumed_from_step"] for a in result["attempts"]]
    assert resumed == sorted(resumed) and len(set(resumed)) == 5  # every attempt made progress
    assert result["weights_sha256"] == one_process_sha256


def test_under_slurms_default_requeue_hold_a_lost_node_resumes_on_the_one_node_left_bitwise(
    node_slurm, tmp_path, one_process_sha256
):
    """Slurm's own requeue hold (a requeued job waits ~2 minutes), `--nodes=1-2`: the job starts on both
    nodes; its worker is SIGKILLed and tfn2 drained (a node gone bad). The job requeues itself, waits out the
    hold, starts on tfn1 alone, resumes with one task of the same K micro-batches and finishes with the
    weights of one process."""
    slurm = node_slurm(2, cred_expire_sec=None)  # a restart; the fixtures of later tests restart it with the short one
    model_dir = tmp_path / "drained"
    job_id = _submit(slurm, model_dir, (*LAYOUT, "--checkpoint_every_steps=125"), nodes="1-2")
    try:
        wait_for_step_of_restart(model_dir, job_id, 0, 150)
        slurm.set_state("tfn2", "DRAIN")
        os.kill(slurm_task_pid(job_id, 1), signal.SIGKILL)
        lost = time.monotonic()
        wait_for_step_of_restart(model_dir, job_id, 1, 1, timeout_sec=400)
        assert time.monotonic() - lost >= 120  # Slurm's hold, not a shortened one
        info = slurm.wait_for_state(job_id, DONE, timeout_sec=300)
    finally:  # a failure here must leave neither the job nor a drained node to the next test
        slurm_daemons.run(["scancel", str(job_id)], slurm.env, check=False)
        slurm.set_state("tfn2", "RESUME")
    log = log_of(model_dir, job_id)
    assert (info["JobState"], info["ExitCode"], info["Restarts"], info["NodeList"]) == ("COMPLETED", "0:0", "1", "tfn1")
    first, second = metrics(model_dir)["attempts"]
    assert first["outcome"].startswith("requeued after a lost task (requeue 1, after ") and first["step"] >= 125
    assert second["resumed_from_step"] == first["step"] and second["outcome"] == "finished"
    assert metrics(model_dir)["num_tasks"] == 1, log[-3000:]
    assert metrics(model_dir)["weights_sha256"] == one_process_sha256
