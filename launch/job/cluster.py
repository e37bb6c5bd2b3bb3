"""Who the tasks of a run are, read from Slurm's or TensorFlow's environment variables.

Every task of a Slurm job step (or every entry of TF_CONFIG's `worker` list) runs `python -m trainer`; task 0
is the chief, the others serve it through a `tf.distribute.Server`. `resolve_cluster` turns the environment
into a `Cluster`: the "host:port" of every task, in task-index order, and this task's index. It reads
variables only (no TensorFlow, no DNS, no sockets), so a wrong layout fails before the slow imports.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping

import hostlist

# Derived ports (no --cluster_port): each job owns PORTS_PER_NODE consecutive ports from a base picked by its
# job id, so two jobs sharing a node do not collide (TF's SlurmClusterResolver uses 8888 + index for every
# job). 12000 + 2500 * 8 = 32000 stays below Linux's ephemeral range (32768-60999 by default).
BASE_PORT = 12000
PORT_SLOTS = 2500
PORTS_PER_NODE = 8


class ClusterError(ValueError):
    """The environment describes a cluster towerflow cannot run on; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class SlurmJob:
    """The Slurm job this process runs in, as its environment says."""

    job_id: str
    array_job_id: str = ""
    array_task_id: str = ""
    restart_count: int = 0  # SLURM_RESTART_COUNT: how often the job was requeued (time limit or preemption)
    node: str = ""

    @property
    def requeue_target(self) -> str:
        """What `scontrol requeue` takes: `ARRAYJOB_TASK` for an array task, else the job id."""
        if self.array_job_id and self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    def describe(self) -> str:
        array = f" (array task {self.requeue_target})" if self.array_task_id else ""
        return f"slurm job {self.job_id}{array}, restart {self.restart_count}, node {self.node or '?'}"


def slurm_job(environ: Mapping[str, str]) -> SlurmJob | None:
    """The Slurm job of this process, or None outside Slurm."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job_id:
        return None
    return SlurmJob(
        job_id=job_id,
        array_job_id=environ.get("SLURM_ARRAY_JOB_ID", ""),
        array_task_id=environ.get("SLURM_ARRAY_TASK_ID", ""),
        restart_count=int(environ.get("SLURM_RESTART_COUNT") or 0),
        node=environ.get("SLURMD_NODENAME", ""),
    )


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The tasks of a run and which one this process is.

    `workers` holds every task's "host:port", indexed by task index; it is empty for a single process that
    starts no server (a Slurm batch step, an `srun --ntasks=1` step, no cluster variables at all).
    """

    workers: tuple[str, ...]
    task_index: int
    source: str  # which variables said so: "slurm", "tf_config" or "none"
    origin: str = ""  # for messages: "slurm job 123 step 0", "TF_CONFIG", ...

    def __post_init__(self):
        if self.workers and not 0 <= self.task_index < len(self.workers):
            raise ClusterError(f"task index {self.task_index} is not in [0, {len(self.workers)})")

    @property
    def num_tasks(self) -> int:
        return max(len(self.workers), 1)

    @property
    def is_chief(self) -> bool:
        return self.task_index == 0

    @property
    def address(self) -> str:
        """This task's "host:port", or "" for a single process without workers."""
        return self.workers[self.task_index] if self.workers else ""

    def describe(self) -> str:
        """One line for the log, e.g. "task 1 of 2 (slurm job 123 step 0), workers node9:12345, node10:12345"."""
        origin = f" ({self.origin})" if self.origin else ""
        workers = f"workers {', '.join(self.workers)}" if self.workers else "single process"
        return f"task {self.task_index} of {self.num_tasks}{origin}, {workers}"


def resolve_cluster(environ: Mapping[str, str], port: int = 0) -> Cluster:
    """The cluster of this run, from a Slurm job step, else TF_CONFIG, else one process.

    Under Slurm what counts is the job *step* this process belongs to: an `srun` step runs
    SLURM_STEP_NUM_TASKS tasks, numbered by SLURM_PROCID in Slurm's block distribution (the first node of the
    step's node list runs tasks 0..n0-1, the next one the following n1, ...). The batch script itself (no
    `srun`) is one process, whatever the allocation's SLURM_NTASKS says. TF_CONFIG is never set by Slurm, so
    outside an `srun` step it wins over the batch step.

    Ports under Slurm: the task with local index `l` on its node (SLURM_LOCALID) listens on
    `base + l`, where `base = port` when `port` > 0 (the --cluster_port flag), else
    `base = 12000 + (SLURM_JOB_ID % 2500) * 8`: each job owns 8 ports per node (at most 8 tasks per node),
    so two jobs sharing a node get different ports unless their ids are equal modulo 2500. TF_CONFIG carries
    its own ports, and `port` is ignored there.

    Args:
      environ: the process environment (only read).
      port: the first port of each node, or 0 to derive it from the job id.

    Raises:
      ClusterError: the variables are incomplete, inconsistent, or describe a layout towerflow cannot run.
    """
    if port < 0:
        raise ClusterError(f"--cluster_port ({port}) must be > 0, or 0 to derive the ports from the Slurm job id")
    if "SLURM_STEP_NUM_TASKS" in environ:
        return _slurm_step_cluster(environ, port)
    if environ.get("TF_CONFIG"):
        return _tf_config_cluster(environ["TF_CONFIG"])
    job = slurm_job(environ)
    if job is not None:
        return Cluster((), 0, "slurm", f"slurm job {job.job_id} batch step")
    return Cluster((), 0, "none", "no Slurm step or TF_CONFIG")


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's compressed task counts, one per node: "2(x3),1" -> [2, 2, 2, 1].

    Raises:
      ClusterError: `text` is not of that form.
    """
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match or match[2] == "0":
            raise ClusterError(f"cannot read the tasks per node {text!r}: expected counts like '2(x3),1'")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def _slurm_step_cluster(environ: Mapping[str, str], port: int) -> Cluster:
    """The tasks of the `srun` step this process belongs to; see `resolve_cluster`."""
    num_tasks = _int_variable(environ, "SLURM_STEP_NUM_TASKS")
    step = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID") or "?"
    origin = f"slurm job {_job_id(environ)} step {step}"
    if num_tasks <= 1:
        return Cluster((), 0, "slurm", origin)
    nodes, counts = _step_nodes(environ, num_tasks)
    procid = _int_variable(environ, "SLURM_PROCID")
    if not 0 <= procid < num_tasks:
        raise ClusterError(f"SLURM_PROCID ({procid}) is not in [0, SLURM_STEP_NUM_TASKS={num_tasks})")
    _check_block_distribution(environ, nodes, counts, procid)
    base = _base_port(environ, port, max(counts))
    pairs = zip(nodes, counts, strict=True)
    workers = tuple(f"{node}:{base + local}" for node, count in pairs for local in range(count))
    return Cluster(workers, procid, "slurm", origin)


def _step_nodes(environ: Mapping[str, str], num_tasks: int) -> tuple[list[str], list[int]]:
    """The step's node names in Slurm's order (never sorted) and the number of tasks on each."""
    nodelist_var = _first_set(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    counts_var = _first_set(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    try:
        nodes = hostlist.expand_hostlist(environ[nodelist_var])
    except hostlist.BadHostlist as e:
        raise ClusterError(f"cannot read {nodelist_var}={environ[nodelist_var]!r}: {e}") from e
    counts = expand_tasks_per_node(environ[counts_var])
    if len(counts) != len(nodes) or sum(counts) != num_tasks:
        raise ClusterError(
            f"{nodelist_var}={environ[nodelist_var]!r} ({len(nodes)} nodes) and {counts_var}="
            f"{environ[counts_var]!r} ({len(counts)} nodes, {sum(counts)} tasks) do not describe the "
            f"SLURM_STEP_NUM_TASKS={num_tasks} tasks of this step"
        )
    return nodes, counts


def _check_block_distribution(environ: Mapping[str, str], nodes: list[str], counts: list[int], procid: int) -> None:
    """Raises ClusterError unless this task sits where block distribution puts SLURM_PROCID.

    Each task checks its own entry (SLURMD_NODENAME, SLURM_LOCALID). Task 0 sits on the first node under any
    distribution, so SLURM_DISTRIBUTION lets the chief refuse too, rather than wait for workers that refused.
    """
    fix = "Use `srun --distribution=block` (or the default distribution)."
    method = environ.get("SLURM_DISTRIBUTION", "").split(",")[0].split(":")[0]
    if method in ("cyclic", "plane", "arbitrary") and max(counts) > 1:
        raise ClusterError(
            f"the task layout is not block-distributed: SLURM_DISTRIBUTION={environ['SLURM_DISTRIBUTION']} "
            f"with up to {max(counts)} tasks per node, but towerflow numbers the tasks node by node. {fix}"
        )
    node_index, first = 0, 0
    while procid >= first + counts[node_index]:
        first += counts[node_index]
        node_index += 1
    expected = (nodes[node_index], procid - first)
    node = environ.get("SLURMD_NODENAME") or expected[0]
    local = _int_variable(environ, "SLURM_LOCALID") if "SLURM_LOCALID" in environ else expected[1]
    if (node, local) != expected:
        raise ClusterError(
            f"the task layout is not block-distributed: SLURM_PROCID {procid} runs on {node} as local task "
            f"{local}, but block distribution over {','.join(nodes)} with tasks per node {counts} puts it on "
            f"{expected[0]} as local task {expected[1]}. {fix}"
        )


def _base_port(environ: Mapping[str, str], port: int, tasks_per_node: int) -> int:
    """The port of local task 0 on every node; see `resolve_cluster` for the formula."""
    if port > 0:
        if port + tasks_per_node - 1 > 65535:
            raise ClusterError(f"--cluster_port ({port}) + {tasks_per_node} tasks per node goes beyond port 65535")
        return port
    if tasks_per_node > PORTS_PER_NODE:
        raise ClusterError(
            f"{tasks_per_node} tasks on one node, but the ports derived from the job id leave room for "
            f"{PORTS_PER_NODE}; set --cluster_port to a free range of {tasks_per_node} ports"
        )
    job_id = _job_id(environ)
    if not job_id.isdigit():
        raise ClusterError(f"cannot derive ports from SLURM_JOB_ID={job_id!r}; set --cluster_port")
    return BASE_PORT + (int(job_id) % PORT_SLOTS) * PORTS_PER_NODE


def _tf_config_cluster(text: str) -> Cluster:
    """The cluster of a TF_CONFIG: a `worker` list whose task 0 is the chief, and `task.index`."""
    try:
        tf_config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ClusterError(f"TF_CONFIG is not valid JSON: {e}") from e
    if not isinstance(tf_config, dict):
        raise ClusterError(f"TF_CONFIG must be a JSON object with `cluster` and `task`, not {text!r}")
    workers = _tf_config_workers(tf_config.get("cluster"))
    task = tf_config.get("task")
    if not isinstance(task, dict) or "index" not in task:
        raise ClusterError('TF_CONFIG has no `task.index`: add "task": {"type": "worker", "index": <this task>}')
    if task.get("type", "worker") != "worker":
        raise ClusterError(f"TF_CONFIG's task.type is {task['type']!r}; towerflow's tasks are all `worker`")
    index = task["index"]
    if not isinstance(index, int) or isinstance(index, bool):
        raise ClusterError(f"TF_CONFIG's task.index must be an integer, not {index!r}")
    if not 0 <= index < len(workers):
        raise ClusterError(f"TF_CONFIG's task.index ({index}) is not in [0, {len(workers)}) (the `worker` list)")
    return Cluster(workers, index, "tf_config", "TF_CONFIG")


def _tf_config_workers(cluster: object) -> tuple[str, ...]:
    """TF_CONFIG's `cluster.worker` list, checked: non-empty, "host:port" entries, no other job types."""
    if not isinstance(cluster, dict):
        raise ClusterError('TF_CONFIG has no `cluster` object: add "cluster": {"worker": ["host:port", ...]}')
    others = sorted(set(cluster) - {"worker"})
    if others:
        raise ClusterError(
            f"TF_CONFIG's cluster has job types {others}: towerflow uses only a `worker` list whose task 0 is "
            f"the chief; list every task (chief first) under `worker`"
        )
    workers = cluster.get("worker")
    if not isinstance(workers, list):
        raise ClusterError('TF_CONFIG\'s cluster has no `worker` list: add "worker": ["host:port", ...]')
    if not workers:
        raise ClusterError("TF_CONFIG's `worker` list is empty: list every task's host:port, the chief first")
    for entry in workers:
        host, _, port = entry.rpartition(":") if isinstance(entry, str) else ("", "", "")
        if not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise ClusterError(f"TF_CONFIG's `worker` entry {entry!r} is not of the form host:port")
    return tuple(workers)


def _first_set(environ: Mapping[str, str], *names: str) -> str:
    """The first of `names` that is set (non-empty) in `environ`."""
    for name in names:
        if environ.get(name):
            return name
    raise ClusterError(f"this Slurm step has none of {', '.join(names)} set")


def _int_variable(environ: Mapping[str, str], name: str) -> int:
    value = environ.get(name, "")
    if not value.strip().isdigit():
        raise ClusterError(f"{name} must be a non-negative integer, not {value!r}")
    return int(value)


def _job_id(environ: Mapping[str, str]) -> str:
    return environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or "?"
