"""What docs/slurm.md ("Who can reach a job's ports") says of several-machine runs, kept true: a task's
TensorFlow server listens on every interface and runs the ops of whoever connects, with no authentication.

A worker task starts as towerflow starts it (`python -m trainer` with TF_CONFIG, task 1 of 2: `distributed.serve`),
and waits for a chief that never comes. A stranger's process, knowing only the worker's host:port, connects and
runs ops on it: it reads a file on the worker's machine and writes another, as the job's user. When towerflow
closes this (an authenticated or local-only transport), this test fails and the doc changes with it.
"""

import json
import os
import subprocess
import sys
import time

from launch.testslurm.ports import free_ports
from tests.support.cluster import BASE_FLAGS
from tests.support.paths import ROOT
from tests.support.runs import trainer_command

STRANGER = """
import sys
import tensorflow as tf

address, secret, written = sys.argv[1:]
tf.config.experimental_connect_to_host(address, job_name="stranger")  # no key, no certificate: a host:port
with tf.device("/job:stranger/replica:0/task:0/device:CPU:0"):  # the worker's CPU, under a job name of our own
    tf.io.write_file(written, tf.strings.join(["read: ", tf.io.read_file(secret)]))
    print(tf.io.read_file(written).numpy().decode())
"""


def _listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on `port` (/proc/net/tcp and tcp6, hex as the kernel writes)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, port_hex = local.split(":")
                if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


def test_a_stranger_on_the_machine_runs_ops_on_a_running_task(tmp_path):
    chief, worker = (f"127.0.0.1:{p}" for p in free_ports(2))
    tf_config = {"cluster": {"worker": [chief, worker]}, "task": {"type": "worker", "index": 1}}
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")} | {"TF_CONFIG": json.dumps(tf_config)}
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        task = subprocess.Popen(
            [*trainer_command(f"--model_dir={tmp_path / 'run'}", "--num_gpus=1"), *BASE_FLAGS],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_for_serving(task, log)
        # Every interface, not only the 127.0.0.1 of its address: IPv6's any-address (dual-stack) or IPv4's.
        port = int(worker.rpartition(":")[2])
        assert _listening_addresses(port) & {"00000000000000000000000000000000", "00000000"}, _listening_addresses(port)
        secret = tmp_path / "only-the-job-knows.txt"
        secret.write_text("the job's secret\n")
        written = tmp_path / "written-by-a-stranger.txt"
        stranger = subprocess.run(
            [sys.executable, "-c", STRANGER, worker, str(secret), str(written)],
            env={k: v for k, v in env.items() if k != "TF_CONFIG"}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert stranger.returncode == 0, stranger.stderr[-2000:]
        assert stranger.stdout.strip() == "read: the job's secret"
        assert written.read_text() == "read: the job's secret\n"
    finally:
        task.kill()
        task.wait()


def _wait_for_serving(task: subprocess.Popen, log, timeout: float = 120) -> None:
    """Until the worker's log says it serves (its server has started), reading the log as it grows."""
    deadline = time.monotonic() + timeout
    while "serving 1 cpu device(s)" not in log.read_text():
        assert task.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)
