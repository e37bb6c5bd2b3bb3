"""towerflow's peers (benchmarks/machines/peers*.py): the TF_CONFIG each task of each peer gets, the ring bound
and bytes-per-step arithmetic, the Slurm peer's TF_CONFIG and sbatch script, the duty-cycle slow-down, and one
short real run of each peer in its own network namespaces (root only, ~15-25 s each, not quick)."""

import json
import os
import stat
import subprocess
import sys
import time

import pytest

from benchmarks.machines.strategies import cluster as pc
from benchmarks.machines.strategies import slurm as peers_slurm
from benchmarks.machines.strategies.mwms import Clock
from benchmarks.machines.strategies.sync import bytes_per_step


@pytest.mark.quick
def test_every_mwms_task_gets_the_same_worker_list_and_its_own_index():
    configs = pc.worker_configs(["10.81.0.11:5000", "10.81.0.12:5001"])
    assert configs == [
        {"cluster": {"worker": ["10.81.0.11:5000", "10.81.0.12:5001"]}, "task": {"type": "worker", "index": 0}},
        {"cluster": {"worker": ["10.81.0.11:5000", "10.81.0.12:5001"]}, "task": {"type": "worker", "index": 1}},
    ]


@pytest.mark.quick
def test_the_ps_cluster_is_chief_workers_ps_in_that_order():
    configs = pc.ps_configs("a:1", ["a:2", "b:3"], ["a:4"])
    cluster = {"chief": ["a:1"], "worker": ["a:2", "b:3"], "ps": ["a:4"]}
    assert [c["cluster"] for c in configs] == [cluster] * 4
    assert [c["task"] for c in configs] == [
        {"type": "chief", "index": 0},
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
        {"type": "ps", "index": 0},
    ]


@pytest.mark.quick
def test_ring_bound_is_two_m_minus_one_over_m_of_the_variables():
    assert pc.ring_bound(2, 614_440) == 614_440
    assert pc.ring_bound(4, 614_440) == 921_660


@pytest.mark.quick
def test_bytes_per_step_is_the_difference_of_the_two_runs_over_s():
    short = {"received": [1_000, 2_000], "sent": [3_000, 4_000]}
    long = {"received": [21_000, 12_000], "sent": [13_000, 44_000]}
    rows = bytes_per_step(short, long, 10, 1_000)  # bound at M = 2: 1 x 1000 bytes
    assert rows == [
        {"task": 0, "received": 2_000.0, "sent": 1_000.0, "received_bound": 2.0, "sent_bound": 1.0},
        {"task": 1, "received": 1_000.0, "sent": 4_000.0, "received_bound": 1.0, "sent_bound": 4.0},
    ]


@pytest.mark.quick
def test_cores_are_shared_out_by_group(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    assert pc.pinned_cores([0, 1]) == ["0", "1"]
    assert pc.pinned_cores([0, 0, 1, 1]) == ["0", "0", "1", "1"]


@pytest.mark.quick
def test_the_clock_leaves_the_first_execution_out():
    clock = Clock()
    clock.ends = [(20, 10.0), (40, 10.5), (60, 11.0)]
    assert clock.rate(128) == (40 * 128 / 1.0, 40, 1.0)


@pytest.mark.quick
def test_slurm_task_tf_config_from_slurm_variables():
    env = {"SLURM_JOB_ID": "1234", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    assert peers_slurm.tf_config(env, ["tfn1", "tfn2"]) == {
        "cluster": {"worker": ["tfn1:21234", "tfn2:21234"]},
        "task": {"type": "worker", "index": 1},
    }
    with pytest.raises(ValueError, match="SLURM_PROCID unset"):
        peers_slurm.tf_config({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2"}, ["tfn1", "tfn2"])
    with pytest.raises(ValueError, match="4 tasks on 2 nodes"):
        peers_slurm.tf_config({**env, "SLURM_NTASKS": "4"}, ["tfn1", "tfn2"])


@pytest.mark.quick
def test_the_sbatch_script_runs_one_mwms_task_per_rank(tmp_path):
    """The script under a fake `srun` that runs its command as rank 1: the peer gets the script's arguments and
    its TF_CONFIG from the task's Slurm variables (a fake `python` echoes both)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nshift\nSLURM_PROCID=1 exec "$@"\n')  # drops --label
    (bin_dir / "python").write_text(
        '#!/bin/bash\nif [ "$3" = tf_config ]; then echo "{\\"task\\": $SLURM_PROCID}"; '
        'else echo "TF_CONFIG=$TF_CONFIG $*"; fi\n'
    )
    for tool in bin_dir.iterdir():
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77"}
    env.update(SLURM_JOB_NODELIST="tfn[1-2]", SLURM_NNODES="2")
    done = subprocess.run(["bash", str(peers_slurm.SBATCH), "7", "/out"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "=== mwms: job 77 on tfn[1-2] (2 nodes)",
        'TF_CONFIG={"task": 1} -m benchmarks.machines.strategies.mwms --steps=7 --out=/out/mwms-77.task1.json',
    ]


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.quick
def test_the_duty_cycle_stops_the_process_two_thirds_of_the_time_and_releases_it():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        throttle = pc.DutyCycle(busy.pid, 3.0)
        states = []
        for _ in range(300):
            states.append(_state(busy.pid))
            time.sleep(0.002)
        throttle.stop()
        stopped = states.count("T") / len(states)
        assert 0.45 <= stopped <= 0.85, stopped  # 2/3 of each 30 ms period, sampled
        assert _state(busy.pid) != "T"
    finally:
        busy.kill()
        busy.wait()


@pytest.fixture
def peer_namespaces():
    """br-peers' namespaces 1..4, taken down afterwards (run no `peers` benchmark alongside)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    pc.NET.up(4)
    yield
    pc.NET.down()


@pytest.mark.netns
@pytest.mark.xdist_group("peer_namespaces")  # one worker: both take up the same namespaces (br-peers, tfpeer1..4)
def test_mwms_trains_on_two_namespaces_with_the_same_trainable_weights_on_both(peer_namespaces, tmp_path):
    from benchmarks.machines.strategies import sync as peers_sync

    run = peers_sync.run_mwms(2, 40, str(tmp_path / "mwms"))
    assert (run["steps"], run["replicas"], run["timed_steps"]) == (40, 2, 20)
    assert run["loss_after"] < 0.6 * run["loss_before"], run
    assert run["task_trainable_hashes"][0] == run["task_trainable_hashes"][1]
    assert min(run["received"][:2]) > 40 * 600_000  # each step's all-reduce crosses both interfaces
    assert len(run["received"]) == len(run["sent"]) == 2  # namespaces 1 and 2 only


@pytest.mark.netns
@pytest.mark.xdist_group("peer_namespaces")
def test_ps_trains_and_reports_its_staleness(peer_namespaces, tmp_path):
    from benchmarks.machines.strategies import asynchronous as peers_async

    run = peers_async.run_ps(60, str(tmp_path / "ps"))
    assert (run["workers"], run["updates"], run["timed_updates"]) == (2, 60, 40)
    assert run["loss_after"] < 0.9 * run["loss_before"], run
    assert run["iterations"] <= run["updates"]
    assert 0 <= run["staleness_mean"] <= run["staleness_max"] <= 60
    with open(tmp_path / "ps.json") as f:
        assert json.load(f)["updates"] == 60
