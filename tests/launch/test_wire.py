"""Each task's bytes per step on its own network interface (launch/testslurm/netns.py, benchmarks/wire.py), root only.

Two tasks x 2 logical CPU devices, each task in its own network namespace, variables on the chief's CPU: every
step the chief sends the worker one copy of the trainable variables (its two towers read the same copy) and
receives one partial gradient sum (its two micro-batches summed on the worker first, docs/towers.md), and the
kernel's counters on the two veth pairs must say so: 1.0x the variable bytes each way, not the 2.0x of one
copy per remote tower. Not in the quick subset: two trainings, ~30 s.
"""

import os

import pytest

from launch.testslurm import netns

pytestmark = pytest.mark.netns

STEPS = 10


@pytest.fixture
def two_namespaces():
    """tfnode1 and tfnode2 on br-tf, taken down afterwards (whoever made them: run no wire benchmark alongside)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    netns.up(2)
    yield
    netns.down()


def test_each_task_moves_one_copy_of_the_variables_each_way_per_step(two_namespaces, tmp_path):
    import models
    from benchmarks.harness.records import ensure_records
    from benchmarks.machines import wire

    workload = wire.WORKLOADS["cnn"]
    model = models.build_model("cnn", workload.setting.example_shape, workload.setting.num_classes)
    trainable = sum(int(v.numpy().size) * 4 for v in model.trainable_variables)
    records = ensure_records(workload.setting)

    cell = wire.measure(workload, records, "cpu", 2, 2, trainable, str(tmp_path), steps=STEPS)

    chief, worker = cell["per_task"]
    for task in (chief, worker):  # the counters are the namespaces' own: both move, both ways
        assert task["received_per_step"] > 0 and task["sent_per_step"] > 0, cell
        assert 0.95 <= task["received_per_variable_byte"] <= 1.1, cell
        assert 0.95 <= task["sent_per_variable_byte"] <= 1.1, cell
    # the bridge only forwards: what one namespace sends, the other receives
    assert worker["received_per_step"] == pytest.approx(chief["sent_per_step"], rel=0.02)
    assert chief["received_per_step"] == pytest.approx(worker["sent_per_step"], rel=0.02)
