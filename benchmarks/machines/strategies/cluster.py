"""The processes of a peers run: TF_CONFIG for each task of each side, each task in its own network namespace
and pinned to its share of the cores, byte counters around the run, and one task slowed by a duty cycle.

Both sides (towerflow and TensorFlow's strategies) start through `start_tasks`, so they get the same
namespaces, the same cores and the same counters. The namespaces are this module's own network (`NET`:
bridge br-peers, 10.81.0.0/24), not launch/testslurm/netns.py's `WIRE`, so a `wire` run or test beside it is untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import threading
import time

from benchmarks.harness import paths
from benchmarks.machines.multinode import cores_of
from benchmarks.machines.wire import PROXY_VARIABLES
from launch.testslurm import netns
from launch.testslurm.ports import free_ports

NET = netns.Network(bridge="br-peers", subnet="10.81.0", prefix="tfpeer", veth_prefix="vpeer")


def task_env() -> dict[str, str]:
    """This process's environment without proxies (gRPC honours them), TF_CONFIG or SLURM_* (as `wire`)."""
    drop = {*PROXY_VARIABLES, *(v.upper() for v in PROXY_VARIABLES), "TF_CONFIG"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SLURM")}
    return {**env, "TF_CPP_MIN_LOG_LEVEL": "2"}


def addresses(count: int, ports: list[int] | None = None) -> list[str]:
    """host:port of namespaces 1..count on `NET` (free ports from this host unless `ports` are given)."""
    ports = ports or free_ports(count)
    return [f"{NET.address(i + 1)}:{port}" for i, port in enumerate(ports)]


def worker_configs(workers: list[str]) -> list[dict]:
    """TF_CONFIG of each task of an all-worker cluster (MWMS, and towerflow's multi-task runs): worker 0 is
    the chief, as both read it."""
    return [{"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}} for i in range(len(workers))]


def ps_configs(chief: str, workers: list[str], ps: list[str]) -> list[dict]:
    """TF_CONFIG of every task of a ParameterServerStrategy cluster, in the order chief, workers, ps."""
    cluster = {"chief": [chief], "worker": workers, "ps": ps}
    roles = [("chief", 0)] + [("worker", i) for i in range(len(workers))] + [("ps", i) for i in range(len(ps))]
    return [{"cluster": cluster, "task": {"type": kind, "index": i}} for kind, i in roles]


def ring_bound(num_tasks: int, variable_bytes: int) -> float:
    """Bytes a ring all-reduce sends, and receives, per task per step: 2(M-1)/M x the variable bytes."""
    return 2 * (num_tasks - 1) / num_tasks * variable_bytes


@dataclasses.dataclass
class Task:
    """One process to start: its argv (without the namespace and taskset), TF_CONFIG, namespace (1-based),
    cores (taskset's list, "" for every core) and log file."""

    argv: list[str]
    tf_config: dict | None
    namespace: int
    cores: str
    log: str


def pinned_cores(groups: list[int]) -> list[str]:
    """Each task's cores when task i belongs to group `groups[i]` of max(groups)+1 equal shares (multinode's
    `cores_of`): [0, 1] puts two tasks on their own halves, [0, 0, 1] two tasks on the first half."""
    return [cores_of(g, max(groups) + 1) for g in groups]


def start(task: Task) -> subprocess.Popen:
    env = task_env()
    if task.tf_config is not None:
        env["TF_CONFIG"] = json.dumps(task.tf_config)
    argv = (["taskset", "-c", task.cores] if task.cores else []) + task.argv
    with open(task.log, "w") as out:  # `ip netns exec` and taskset exec: the Popen's pid is Python's
        return NET.run_in(task.namespace, argv, env, cwd=paths.REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)


def counters(count: int) -> list[tuple[int, int]]:
    return [NET.read_counters(i + 1) for i in range(count)]


def run_tasks(tasks: list[Task], wait_for: list[int], timeout: float, slow: tuple[int, float] | None = None) -> dict:
    """Starts `tasks`, waits for those at indices `wait_for` to exit (the rest, servers that never return, are
    then killed), and returns the seconds, exit codes and each namespace's (received, sent) bytes.

    `slow`: (index, factor): that task may run only 1/factor of the time (`DutyCycle`)."""
    spaces = sorted({t.namespace for t in tasks})
    before = counters(max(spaces))
    began = time.monotonic()
    procs = [start(t) for t in tasks]
    throttle = DutyCycle(procs[slow[0]].pid, slow[1]) if slow else None
    try:
        deadline = began + timeout
        while time.monotonic() < deadline:
            codes = [procs[i].poll() for i in wait_for]
            if None not in codes or any(c not in (None, 0) for c in codes):
                break
            time.sleep(0.1)
        codes = [p.poll() for p in procs]
    finally:
        if throttle:
            throttle.stop()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    after = counters(max(spaces))
    return {
        "seconds": time.monotonic() - began,
        "codes": codes,
        "received": [a[0] - b[0] for a, b in zip(after, before, strict=True)],
        "sent": [a[1] - b[1] for a, b in zip(after, before, strict=True)],
    }


class DutyCycle:
    """Lets process `pid` run only 1/factor of the wall time: SIGCONT, run PERIOD/factor, SIGSTOP for the
    rest of PERIOD (what cpulimit does). Every thread of the process stops, its gRPC server too, whichever
    side's process it is: the same slow-down for towerflow's task and the peer's worker."""

    PERIOD_SEC = 0.03

    def __init__(self, pid: int, factor: float):
        if factor <= 1:
            raise ValueError(f"a slow-down factor above 1, not {factor}")
        self.pid, self.factor = pid, factor
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        run = self.PERIOD_SEC / self.factor
        try:
            while not self.done.is_set():
                os.kill(self.pid, signal.SIGCONT)
                time.sleep(run)
                os.kill(self.pid, signal.SIGSTOP)
                time.sleep(self.PERIOD_SEC - run)
        except ProcessLookupError:
            return
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def tail(path: str, chars: int = 2000) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-chars:]
