"""Several machines, over TensorFlow's own gRPC runtime.

Every task of the job runs `python -m trainer` with the same flags. Task 0, the chief, connects to the cluster
(`tf.config.experimental_connect_to_cluster`) and runs the loop with towers on every task's devices
(`trainer.system.devices`); it alone writes to `--model_dir`. Every other task serves its devices with a
`tf.distribute.Server` (`serve`) until the chief tells it the run's exit code, which it exits with too: 0 when
training finished, 75 when it stopped to be resumed. The chief tells every worker with a TensorFlow op run on
that worker's CPU, writing a small status file on the worker's own disk (`status_path`): no shared file
system is needed. A chief that dies without a word (SIGKILL) is noticed by its port closing: exit code 75.

Failure is bounded, never a hang: every task watches its peers by one rule (`trainer.system.peers`): a peer
whose TensorFlow server does not answer for `--peer_timeout_sec` (a cut network, a frozen process), or whose
port is closed (the process is gone), ends the attempt with 75, naming it. A step that needs a dead worker
fails at once with `UnavailableError`, which `explain` turns into `WorkerLost` (75 too). Checkpoints are
atomic, so the last one stays valid and a rerun resumes from it.

Both the chief and the workers send their stderr through `trainer.system.console.filter_from_now`: TensorFlow's
remote functions and iterators print known-harmless C++ lines while a job runs (`console.HARMLESS`).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import time

import tensorflow as tf

from launch.job.cluster import Cluster
from trainer.settings.config import RunConfig
from trainer.system import console, determinism, devices, peers, runtime
from trainer.system import stop as stop_lib

CONNECTED = "connected"  # a worker's status once the chief has joined it; then the chief's exit code


class WorkerLost(RuntimeError):
    """A worker task stopped answering; the message names it."""


def reachable(address: str, timeout: float = peers.PROBE_TIMEOUT_SEC) -> bool:
    """Whether a TCP connection to `host:port` opens (a gRPC server listens there)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def connect(cluster: Cluster, config: RunConfig, timeout_sec: float, log=print) -> None:
    """Chief: waits for every worker's server, then joins the cluster as task 0.

    Raises:
      WorkerLost: a worker was not listening after `timeout_sec`; the message lists them.
    """
    console.filter_from_now(console.level_in_force())  # TensorFlow's harmless lines of several tasks, as they come
    # Threads and GPU memory before anything starts TensorFlow's devices (joining the cluster does); `build`
    # applies them again, which TensorFlow takes as a no-op once they are in force.
    runtime.apply(config.runtime, config.deterministic)
    if config.towers.device == "cpu":
        devices.configure_logical_cpus(config.towers.num_towers)
    missing = _wait_for(cluster.workers[1:], timeout_sec)
    if missing:
        raise WorkerLost(
            f"no server listens at {', '.join(missing)} after {timeout_sec:.0f} s: those tasks did not start or "
            f"died starting (see their logs); every task of the job must run `python -m trainer` with the same flags"
        )
    spec = tf.train.ClusterSpec({"worker": list(cluster.workers)})
    tf.config.experimental_connect_to_cluster(spec, job_name="worker", task_index=0, protocol="grpc")
    tell_workers(cluster, CONNECTED)
    log(f"chief of {cluster.describe()}")


def status_path(address: str) -> str:
    """Where the chief writes a worker's status, on the worker's machine: unique per host and port, as servers
    are. The host too: where machines share /tmp (the test Slurm's nodes, namespaces of one machine), the
    workers of one job on several nodes have the same port, and one's end removed the other's exit code."""
    host, _, port = address.rpartition(":")
    return os.path.join("/tmp", f"towerflow-worker-{host.strip('[]')}-{port}.status")


def tell_workers(cluster: Cluster, status) -> None:
    """Writes `status` (CONNECTED, or the chief's exit code) into every worker's status file, from the chief.
    A worker that cannot be reached is skipped: it is gone already, or its watch of the chief's port ends it."""
    for task in range(1, cluster.num_tasks):
        try:
            path = status_path(cluster.workers[task])
            with tf.device(f"{devices.task_prefix(task, cluster.num_tasks)}{devices.HOST_DEVICE}"):
                tf.io.write_file(path, str(status))
                tf.io.read_file(path).numpy()  # remote ops run asynchronously: wait until the file is written
        except tf.errors.OpError as e:
            who = describe_task(cluster, task)
            print(f"warning: could not tell {who} the run's status: {cause(e)}", file=sys.stderr)


def _wait_for(addresses, timeout_sec: float) -> list[str]:
    deadline = time.monotonic() + timeout_sec
    waiting = list(addresses)
    while waiting and time.monotonic() < deadline:
        waiting = [a for a in waiting if not reachable(a)]
        if waiting:
            time.sleep(0.5)
    return waiting


def describe_task(cluster: Cluster, task: int) -> str:
    return f"worker task {task} ({cluster.workers[task]})"


_TASK = re.compile(r"/job:worker/replica:0/task:(\d+)")


def explain(error: BaseException, cluster: Cluster) -> WorkerLost | None:
    """A `WorkerLost` naming the task when `error` says a remote task was lost, else None."""
    if not isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError)):
        return None
    tasks = sorted({int(t) for t in _TASK.findall(str(error)) if 0 < int(t) < cluster.num_tasks})
    if not tasks:
        tasks = [t for t in range(1, cluster.num_tasks) if not reachable(cluster.workers[t])]
    if not tasks:
        return None
    who = ", ".join(describe_task(cluster, t) for t in tasks)
    return WorkerLost(f"lost {who}: {cause(error)}. The last checkpoint is kept: rerun the job to resume from it")


_GRPC_MESSAGE = re.compile(r'grpc_message:"([^"]+)"')
_HEADERS = ("Graph execution error", "Detected at node", "Encountered when executing", "Additional GRPC error")


def cause(error: BaseException) -> str:
    """What went wrong, in a line: gRPC's own message when there is one ("Socket closed", "failed to connect
    ..."), else the first line of the error that is not one of TensorFlow's headers."""
    text = str(error)
    grpc = _GRPC_MESSAGE.search(text)
    if grpc:
        return grpc.group(1)[:200]
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(_HEADERS)]
    return (lines[0] if lines else type(error).__name__)[:200]


def serve(cluster: Cluster, config: RunConfig, stop: stop_lib.StopRequest, log=print) -> int:
    """Worker: serves this task's devices until the chief says how the run ended; returns that exit code.

    Stop signals do not end a worker the chief has joined: the chief checkpoints through the workers' input
    pipelines, then tells them. Without a chief after --cluster_timeout_sec, the worker gives up (1; 75 if
    signalled); a chief lost later ends it with 75 (`peers.PeerWatch`, --peer_timeout_sec).
    """
    console.filter_from_now(console.level_in_force())  # TensorFlow's harmless lines of several tasks, as they come
    determinism.configure(config.seed, config.deterministic)
    status = status_path(cluster.address)
    if os.path.exists(status):
        os.remove(status)  # a previous run's
    towers = config.towers
    session_config = tf.compat.v1.ConfigProto()
    if towers.device == "cpu":
        session_config.device_count["CPU"] = towers.num_towers
    runtime.configure_worker(config.runtime, session_config)
    spec = tf.train.ClusterSpec({"worker": list(cluster.workers)})
    server = tf.distribute.Server(spec, "worker", cluster.task_index, protocol="grpc", config=session_config)
    server.start()
    chief = cluster.workers[0]
    log(f"{cluster.describe()}: serving {towers.num_towers} {towers.device} device(s) to the chief at {chief}")
    try:
        return _serve_until_the_end(status, chief, config, stop, log)
    finally:  # the status file is the chief's message to this run only: nothing stays in /tmp
        with contextlib.suppress(OSError):
            os.remove(status)


def _serve_until_the_end(status: str, chief: str, config: RunConfig, stop: stop_lib.StopRequest, log) -> int:
    """Worker: waits for the chief to connect, then for the exit code it writes into `status`; returns it."""
    timeout_sec, peer_timeout_sec = config.cluster.timeout_sec, config.cluster.peer_timeout_sec
    waited = _wait_for_chief(status, chief, timeout_sec, stop)
    if waited == SQUATTED:
        print(
            f"error: the chief's port ({chief}) is held by a program that is not a TensorFlow server, so the chief "
            f"cannot start (its log says so); free the port or give the tasks other ports",
            file=sys.stderr,
        )
        return stop_lib.EXIT_USAGE
    if not waited:
        log(f"the chief at {chief} never connected within {timeout_sec:.0f} s" if not stop.requested else "stopped")
        return stop_lib.EXIT_RESUMABLE if stop.requested else stop_lib.EXIT_FAILED
    with peers.PeerWatch({0: chief}, lambda task: f"the chief (task 0, {chief})", peer_timeout_sec):
        code = _wait_for_exit_code(status)
    log(f"the chief at {chief} ended the run with exit code {code}; exiting with it")
    return code


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


SQUATTED = "squatted"  # `_wait_for_chief`: the chief's port is another program's


def _wait_for_chief(status: str, chief: str, timeout_sec: float, stop: stop_lib.StopRequest, every: float = 2.0):
    """True once the chief has connected; False after `timeout_sec` or a stop; SQUATTED when the chief's port
    answers, but not as a gRPC server: the chief cannot start, no use waiting."""
    deadline = time.monotonic() + timeout_sec
    next_probe = time.monotonic()
    while time.monotonic() < deadline and not stop.requested:
        if _read(status) is not None:
            return True
        if time.monotonic() >= next_probe:
            if peers.probe(chief, 3.0) in (peers.Probe.MUTE, peers.Probe.NOT_GRPC) and _read(status) is None:
                return SQUATTED
            next_probe = time.monotonic() + every
        time.sleep(0.2)
    return _read(status) is not None


def _wait_for_exit_code(status: str) -> int:
    """The exit code the chief writes at its end (the caller's `PeerWatch` ends the wait if the chief is lost)."""
    while True:
        text = _read(status)
        if text not in (None, CONNECTED, ""):
            return int(text) if text.lstrip("-").isdigit() else stop_lib.EXIT_FAILED
        time.sleep(0.5)
