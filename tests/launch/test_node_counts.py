"""A towerflow job whose node count changes between attempts, on three real Slurm nodes (tests/support/node_fixture.py:
launch/testslurm/node_slurm.py, three slurmd in network namespaces of their own). One `--nodes=1-3` job, one task per
node with one tower each and K = 6 micro-batches (1, 2 and 3 towers all divide it), is submitted with tfn3
drained, so Slurm starts it on tfn1 and tfn2; mid-run tfn2 is drained and the job gets the time-limit
warning (the chief checkpoints and requeues it), so its second attempt has tfn1 alone; then tfn2 and tfn3
are resumed and the warning comes again, and the third attempt gets all three, the range's MAX. It finishes
with the weights of one uninterrupted process. The job is shared by the tests below, which check different
things about it."""

import dataclasses
import re
import signal

import pytest

from launch.testslurm import slurm_daemons
from tests.support.cluster import Job, metrics
from tests.support.holds import held, trainer_pids
from tests.support.node_jobs import DONE, attempts_in_log, log_of, submit, wait_for_steps_past_resume

pytestmark = pytest.mark.twonode

# Each warning (and the node changes before it) comes while the job's tasks are held still at a step until it is
# pending (tests/support/holds.py), so the job needs no length of its own to outlast it: 120 steps, not 300.
STEPS = 120
LAYOUT = ("--micro_batches=6", "--global_batch_size=48", f"--train_steps={STEPS}", "--seed=11", "--log_every_steps=10")
# Steps each attempt trains at least before the warning (the stop comes at the next step boundary).
STEPS_PER_ATTEMPT = 30


@dataclasses.dataclass(frozen=True)
class ResizedJob:
    job_id: int
    info: dict[str, str]  # `scontrol show job` once it ended
    log: str
    metrics: dict
    reference_sha256: str


@pytest.fixture(scope="module")
def resized_job(node_slurm, tmp_path_factory) -> ResizedJob:
    """The reference first (one process, 3 towers, outside Slurm: never beside the job on 2 cores), then the
    job on 2, 1 and 3 nodes."""
    reference_dir = tmp_path_factory.mktemp("one-process") / "run"
    reference = Job(reference_dir, [{}], 3, *LAYOUT)
    assert reference.wait() == [0], reference.output(0)[-3000:]
    slurm = node_slurm(3)
    model_dir = tmp_path_factory.mktemp("resized") / "run"
    slurm.set_state("tfn3", "DRAIN")
    job_id = 0
    try:
        job_id = submit(slurm, model_dir, LAYOUT, nodes="1-3", num_gpus=1)
        wait_for_steps_past_resume(model_dir, job_id, 0, STEPS_PER_ATTEMPT)  # from step 0
        with held(trainer_pids(model_dir), signal.SIGUSR1):  # still until the warning is pending (holds.py)
            slurm.set_state("tfn2", "DRAIN")  # before the warning: the requeued job must not get it back
            _warn(slurm, job_id)
        wait_for_steps_past_resume(model_dir, job_id, 1, STEPS_PER_ATTEMPT)
        with held(trainer_pids(model_dir), signal.SIGUSR1):
            for node in ("tfn2", "tfn3"):
                slurm.set_state(node, "RESUME")
            _warn(slurm, job_id)
        info = slurm.wait_for_state(job_id, DONE, timeout_sec=240)
    finally:  # a failure here must leave neither the job nor a drained node to the next test
        if job_id:
            slurm_daemons.run(["scancel", str(job_id)], slurm.env, check=False)
        for node in ("tfn2", "tfn3"):
            slurm_daemons.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], slurm.env, check=False)
    return ResizedJob(job_id, info, log_of(model_dir, job_id), metrics(model_dir), _sha256(reference_dir))


def _warn(slurm, job_id: int) -> None:
    """The time-limit warning, as Slurm sends it (`--signal=USR1@W` without B:): SIGUSR1 to every step task."""
    slurm_daemons.run(["scancel", "--signal=USR1", str(job_id)], slurm.env)


def _sha256(model_dir) -> str:
    return metrics(model_dir)["weights_sha256"]


def _tasks_and_node(attempt_log: str) -> tuple[int, str]:
    """(how many tasks srun started, the batch shell's node) of one attempt's part of the log: srun's --label
    numbers every task's lines."""
    node = attempt_log.split(" on ", 1)[1].split()[0]
    return len(set(re.findall(r"^(\d+): ", attempt_log, re.MULTILINE))), node


def test_a_job_resumed_on_2_then_1_then_3_nodes_finishes_with_the_weights_of_one_process(resized_job):
    job = resized_job
    ended = (job.info["JobState"], job.info["ExitCode"], job.info["Restarts"])
    assert ended == ("COMPLETED", "0:0", "2"), job.log[-3000:]
    parts = attempts_in_log(job.log, job.job_id)
    assert [_tasks_and_node(part) for part in parts] == [(2, "tfn1"), (1, "tfn1"), (3, "tfn1")], job.log[-3000:]
    attempts = job.metrics["attempts"]
    assert [a["outcome"].startswith("requeued for the time limit") for a in attempts] == [True, True, False]
    assert attempts[-1]["outcome"] == "finished"
    resumed = [a["resumed_from_step"] for a in attempts]
    assert resumed[0] == 0 and resumed[1] >= STEPS_PER_ATTEMPT and resumed[2] >= resumed[1] + STEPS_PER_ATTEMPT
    assert (job.metrics["num_tasks"], job.metrics["num_towers"], job.metrics["global_step"]) == (3, 3, STEPS)
    assert job.metrics["weights_sha256"] == job.reference_sha256


def test_a_node_range_requeued_while_every_node_is_idle_gets_them_all(resized_job):
    """`--nodes=1-3` started on 2 of 3 (tfn3 drained) and resumed on 1: once requeued with all three idle, Slurm
    gives the job its MAX, and the trainer's cluster spans them (one task per node, each found by name)."""
    job = resized_job
    assert (job.info["NumNodes"], job.info["NodeList"]) == ("3", "tfn[1-3]"), job.info
    last = attempts_in_log(job.log, job.job_id)[-1]
    port = 12000 + (job.job_id % 2500) * 8
    workers = f"workers tfn1:{port}, tfn2:{port}, tfn3:{port}"
    assert f"chief of task 0 of 3 (slurm job {job.job_id} step 0), {workers}" in last, last[-3000:]
