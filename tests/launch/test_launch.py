"""launch.job.cluster: the tasks of a run from Slurm step / TF_CONFIG variables, their ports, and bad layouts."""

import json

import pytest

from launch.job.cluster import Cluster, ClusterError, expand_tasks_per_node, resolve_cluster

pytestmark = pytest.mark.quick  # the development subset: fast, and covers this file's checks

# SLURM_JOB_ID 123 -> derived base port 12000 + (123 % 2500) * 8
BASE_123 = 12984


def step_env(nodelist, tasks_per_node, procid, localid, node, job_id="123", **extra):
    """The variables `srun` gives one task of step 0 (the SLURM_STEP_* ones only)."""
    num_tasks = sum(expand_tasks_per_node(tasks_per_node))
    return {
        "SLURM_JOB_ID": job_id,
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": str(num_tasks),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURMD_NODENAME": node,
        **extra,
    }


def tf_config_env(cluster, task):
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}


@pytest.mark.parametrize(
    "text, expected",
    [("1", [1]), ("2(x3),1", [2, 2, 2, 1]), ("1,2", [1, 2]), ("4(x2)", [4, 4]), ("3,1(x2),2", [3, 1, 1, 2])],
)
def test_expand_tasks_per_node(text, expected):
    assert expand_tasks_per_node(text) == expected


@pytest.mark.parametrize("text", ["", "2(x)", "x2", "2(x0)", "2(3)", "1,,1", "-1"])
def test_expand_tasks_per_node_refuses_other_forms(text):
    with pytest.raises(ClusterError, match="cannot read the tasks per node"):
        expand_tasks_per_node(text)


@pytest.mark.parametrize(
    "nodelist, tasks_per_node, procid, localid, node, workers",
    [
        # node9 comes before node10 (Slurm's order, not the lexical one)
        ("node[9-10]", "1(x2)", 0, 0, "node9", ("node9:12984", "node10:12984")),
        ("node[9-10]", "1(x2)", 1, 0, "node10", ("node9:12984", "node10:12984")),
        ("gpu[01-02,05]", "1(x3)", 2, 0, "gpu05", ("gpu01:12984", "gpu02:12984", "gpu05:12984")),
        ("a,b[1-2]", "1(x3)", 1, 0, "b1", ("a:12984", "b1:12984", "b2:12984")),
        # two tasks per node: local task l listens on base + l
        ("node[9-10]", "2(x2)", 0, 0, "node9", ("node9:12984", "node9:12985", "node10:12984", "node10:12985")),
        ("node[9-10]", "2(x2)", 3, 1, "node10", ("node9:12984", "node9:12985", "node10:12984", "node10:12985")),
        # uneven: two tasks on the first node, one on the second
        ("node[9-10]", "2,1", 1, 1, "node9", ("node9:12984", "node9:12985", "node10:12984")),
        ("node[9-10]", "2,1", 2, 0, "node10", ("node9:12984", "node9:12985", "node10:12984")),
    ],
)
def test_slurm_step_workers_in_block_order(nodelist, tasks_per_node, procid, localid, node, workers):
    cluster = resolve_cluster(step_env(nodelist, tasks_per_node, procid, localid, node))
    assert cluster == Cluster(workers, procid, "slurm", "slurm job 123 step 0")
    assert cluster.num_tasks == len(workers)
    assert cluster.is_chief == (procid == 0)
    assert cluster.address == f"{node}:{BASE_123 + localid}"


def test_describe_names_the_task_the_step_and_the_workers():
    cluster = resolve_cluster(step_env("node[9-10]", "1(x2)", 1, 0, "node10"))
    assert cluster.describe() == "task 1 of 2 (slurm job 123 step 0), workers node9:12984, node10:12984"


def test_step_variables_win_over_the_job_ones():
    environ = step_env(
        "node[9-10]",
        "1(x2)",
        1,
        0,
        "node10",
        SLURM_JOB_NODELIST="node[1-4]",
        SLURM_NODELIST="node[1-4]",
        SLURM_TASKS_PER_NODE="2(x4)",
    )
    assert resolve_cluster(environ).workers == ("node9:12984", "node10:12984")


def test_job_variables_are_the_fallback():
    environ = step_env("unused", "1", 1, 0, "node10")
    del environ["SLURM_STEP_NODELIST"], environ["SLURM_STEP_TASKS_PER_NODE"]
    environ.update(SLURM_JOB_NODELIST="node[9-10]", SLURM_TASKS_PER_NODE="1(x2)", SLURM_STEP_NUM_TASKS="2")
    assert resolve_cluster(environ).workers == ("node9:12984", "node10:12984")
    del environ["SLURM_JOB_NODELIST"]
    environ["SLURM_NODELIST"] = "gpu[1-2]"
    assert resolve_cluster({**environ, "SLURMD_NODENAME": "gpu2"}).workers == ("gpu1:12984", "gpu2:12984")


@pytest.mark.parametrize("job_id, base", [("123", 12984), ("124", 12992), ("2499", 31992), ("2500", 12000)])
def test_derived_port_is_12000_plus_8_per_job_id_slot(job_id, base):
    environ = step_env("node[9-10]", "2(x2)", 1, 1, "node9", job_id=job_id)
    assert resolve_cluster(environ).workers == (
        f"node9:{base}",
        f"node9:{base + 1}",
        f"node10:{base}",
        f"node10:{base + 1}",
    )


def test_two_jobs_on_one_node_get_different_ports():
    # 7001 % 2500 = 2001 -> 12000 + 2001 * 8; the next id gets the next 8 ports
    first = resolve_cluster(step_env("node9", "2", 0, 0, "node9", job_id="7001"))
    second = resolve_cluster(step_env("node9", "2", 0, 0, "node9", job_id="7002"))
    assert first.workers == ("node9:28008", "node9:28009")
    assert second.workers == ("node9:28016", "node9:28017")
    assert not set(first.workers) & set(second.workers)


def test_explicit_port_overrides_the_derived_one():
    environ = step_env("node[9-10]", "2(x2)", 2, 0, "node10")
    cluster = resolve_cluster(environ, port=23456)
    assert cluster.workers == ("node9:23456", "node9:23457", "node10:23456", "node10:23457")
    assert cluster.address == "node10:23456"


def test_explicit_port_allows_more_than_8_tasks_per_node():
    cluster = resolve_cluster(step_env("node9", "10", 9, 9, "node9"), port=30000)
    assert cluster.workers == tuple(f"node9:{30000 + i}" for i in range(10))


@pytest.mark.parametrize(
    "port, message",
    [(-1, r"--cluster_port \(-1\) must be > 0"), (65535, r"--cluster_port \(65535\) \+ 2 tasks per node goes beyond")],
)
def test_bad_explicit_port(port, message):
    with pytest.raises(ClusterError, match=message):
        resolve_cluster(step_env("node9", "2", 0, 0, "node9"), port=port)


def test_more_than_8_tasks_per_node_needs_cluster_port():
    with pytest.raises(ClusterError, match=r"9 tasks on one node.*room for 8; set --cluster_port"):
        resolve_cluster(step_env("node[9-10]", "9,1", 0, 0, "node9"))


@pytest.mark.parametrize(
    "procid, localid, node, wrong",
    [
        # cyclic over node[9-10] with 2 tasks each: procid 1 on node10 (local 0), procid 2 on node9 (local 1)
        (1, 0, "node10", "SLURM_PROCID 1 runs on node10 as local task 0, .* puts it on node9 as local task 1"),
        (2, 1, "node9", "SLURM_PROCID 2 runs on node9 as local task 1, .* puts it on node10 as local task 0"),
        # right node, wrong local id
        (3, 0, "node10", "SLURM_PROCID 3 runs on node10 as local task 0, .* puts it on node10 as local task 1"),
    ],
)
def test_cyclic_distribution_is_refused(procid, localid, node, wrong):
    with pytest.raises(ClusterError, match=f"not block-distributed: {wrong}.*srun --distribution=block"):
        resolve_cluster(step_env("node[9-10]", "2(x2)", procid, localid, node))


def test_chief_refuses_a_cyclic_step_from_slurm_distribution():
    environ = step_env("node[9-10]", "2(x2)", 0, 0, "node9", SLURM_DISTRIBUTION="cyclic:block")
    with pytest.raises(ClusterError, match=r"SLURM_DISTRIBUTION=cyclic:block .*srun --distribution=block"):
        resolve_cluster(environ)
    # with one task per node, cyclic and block are the same layout
    environ = step_env("node[9-10]", "1(x2)", 0, 0, "node9", SLURM_DISTRIBUTION="cyclic")
    assert resolve_cluster(environ).workers == ("node9:12984", "node10:12984")
    environ = step_env("node[9-10]", "2(x2)", 0, 0, "node9", SLURM_DISTRIBUTION="block")
    assert resolve_cluster(environ).num_tasks == 4


@pytest.mark.parametrize(
    "change, message",
    [
        ({"SLURM_STEP_TASKS_PER_NODE": "2,1"}, r"\(2 nodes, 3 tasks\) do not describe the SLURM_STEP_NUM_TASKS=4"),
        ({"SLURM_STEP_NODELIST": "node[9-11]"}, r"\(3 nodes\) and .* \(2 nodes, 4 tasks\) do not describe"),
        ({"SLURM_STEP_NODELIST": "node[9-"}, r"cannot read SLURM_STEP_NODELIST='node\[9-'"),
        ({"SLURM_STEP_NODELIST": ""}, "none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST set"),
        ({"SLURM_PROCID": "4"}, r"SLURM_PROCID \(4\) is not in \[0, SLURM_STEP_NUM_TASKS=4\)"),
        ({"SLURM_PROCID": ""}, "SLURM_PROCID must be a non-negative integer, not ''"),
        ({"SLURM_JOB_ID": "abc"}, "cannot derive ports from SLURM_JOB_ID='abc'; set --cluster_port"),
    ],
)
def test_inconsistent_slurm_step_variables(change, message):
    with pytest.raises(ClusterError, match=message):
        resolve_cluster({**step_env("node[9-10]", "2(x2)", 0, 0, "node9"), **change})


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, Cluster((), 0, "none", "no Slurm step or TF_CONFIG")),
        # the batch script of an allocation of 2 tasks runs one process
        (
            {"SLURM_JOB_ID": "9", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"},
            Cluster((), 0, "slurm", "slurm job 9 batch step"),
        ),
        # an `srun --ntasks=1` step inside that allocation
        (
            {"SLURM_JOB_ID": "9", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_ID": "3"},
            Cluster((), 0, "slurm", "slurm job 9 step 3"),
        ),
    ],
)
def test_single_process(environ, expected):
    cluster = resolve_cluster(environ, port=5000)
    assert cluster == expected
    assert (cluster.num_tasks, cluster.is_chief, cluster.address) == (1, True, "")
    assert cluster.describe() == f"task 0 of 1 ({expected.origin}), single process"


def test_tf_config():
    environ = tf_config_env({"worker": ["a:2222", "b:2223", "[::1]:2224"]}, {"type": "worker", "index": 1})
    cluster = resolve_cluster(environ, port=5000)  # TF_CONFIG's ports stand
    assert cluster == Cluster(("a:2222", "b:2223", "[::1]:2224"), 1, "tf_config", "TF_CONFIG")
    assert (cluster.num_tasks, cluster.is_chief, cluster.address) == (3, False, "b:2223")
    assert cluster.describe() == "task 1 of 3 (TF_CONFIG), workers a:2222, b:2223, [::1]:2224"
    assert resolve_cluster(tf_config_env({"worker": ["a:1"]}, {"index": 0})).is_chief  # task.type is optional


def test_tf_config_outside_a_step_wins_over_the_batch_step():
    environ = {"SLURM_JOB_ID": "9", **tf_config_env({"worker": ["a:1", "b:1"]}, {"index": 1})}
    assert resolve_cluster(environ) == Cluster(("a:1", "b:1"), 1, "tf_config", "TF_CONFIG")


@pytest.mark.parametrize(
    "tf_config, message",
    [
        ("{not json", "TF_CONFIG is not valid JSON: Expecting property name"),
        ("[1]", r"TF_CONFIG must be a JSON object with `cluster` and `task`, not '\[1\]'"),
        ({"task": {"index": 0}}, "TF_CONFIG has no `cluster` object"),
        ({"cluster": {}, "task": {"index": 0}}, "TF_CONFIG's cluster has no `worker` list"),
        ({"cluster": {"worker": "a:1"}, "task": {"index": 0}}, "TF_CONFIG's cluster has no `worker` list"),
        ({"cluster": {"worker": []}, "task": {"index": 0}}, "TF_CONFIG's `worker` list is empty"),
        (
            {"cluster": {"worker": ["a:1", "b"]}, "task": {"index": 0}},
            "`worker` entry 'b' is not of the form host:port",
        ),
        ({"cluster": {"worker": ["a:x"]}, "task": {"index": 0}}, "`worker` entry 'a:x' is not of the form host:port"),
        ({"cluster": {"worker": [":1"]}, "task": {"index": 0}}, "`worker` entry ':1' is not of the form host:port"),
        ({"cluster": {"worker": [7]}, "task": {"index": 0}}, "`worker` entry 7 is not of the form host:port"),
        ({"cluster": {"worker": ["a:1"]}}, "TF_CONFIG has no `task.index`"),
        ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}}, "TF_CONFIG has no `task.index`"),
        ({"cluster": {"worker": ["a:1"]}, "task": {"index": 1}}, r"task.index \(1\) is not in \[0, 1\)"),
        ({"cluster": {"worker": ["a:1"]}, "task": {"index": -1}}, r"task.index \(-1\) is not in \[0, 1\)"),
        ({"cluster": {"worker": ["a:1"]}, "task": {"index": "0"}}, "task.index must be an integer, not '0'"),
        ({"cluster": {"worker": ["a:1"]}, "task": {"index": 0.0}}, "task.index must be an integer, not 0.0"),
        ({"cluster": {"worker": ["a:1"]}, "task": {"index": True}}, "task.index must be an integer, not True"),
        (
            {"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}},
            "task.type is 'chief'; towerflow's tasks are all `worker`",
        ),
        (
            {"cluster": {"worker": ["a:1"], "chief": ["c:1"]}, "task": {"type": "worker", "index": 0}},
            r"job types \['chief'\]: towerflow uses only a `worker` list whose task 0 is the chief",
        ),
        (
            {"cluster": {"worker": ["a:1"], "ps": ["p:1"], "evaluator": ["e:1"]}, "task": {"index": 0}},
            r"job types \['evaluator', 'ps'\]: towerflow uses only a `worker` list",
        ),
    ],
)
def test_bad_tf_config_says_what_is_wrong(tf_config, message):
    text = tf_config if isinstance(tf_config, str) else json.dumps(tf_config)
    with pytest.raises(ClusterError, match=message):
        resolve_cluster({"TF_CONFIG": text})


def test_cluster_error_is_a_value_error():
    assert issubclass(ClusterError, ValueError)
    with pytest.raises(ClusterError, match=r"task index 2 is not in \[0, 2\)"):
        Cluster(("a:1", "b:1"), 2, "tf_config")
