"""Start the tasks of one multi-machine run as processes on 127.0.0.1, from TF_CONFIG or faked Slurm variables."""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import time

from launch.testslurm.ports import free_ports
from tests.support.paths import ROOT
from tests.support.runs import cpu_flags, trainer_command

BASE_FLAGS = cpu_flags(
    num_gpus=None,
    parameter_device="cpu",
    deterministic=True,
    log_every_steps=1,
    eval_every_steps=0,
    histogram_every_steps=0,
    export="false",
    cluster_timeout_sec=60,
)


def tf_config_envs(num_tasks: int) -> list[dict]:
    workers = [f"127.0.0.1:{p}" for p in free_ports(num_tasks)]
    return [
        {"TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})}
        for i in range(num_tasks)
    ]


def slurm_envs(num_tasks: int) -> list[dict]:
    """What `srun --ntasks=N` on one node named localhost sets; the job id picks free ports (launch.job.cluster)."""
    while True:
        job_id = random.randrange(100_000, 900_000)
        base = 12000 + (job_id % 2500) * 8
        if all(_free(base + i) for i in range(num_tasks)):
            break
    common = {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": str(num_tasks),
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": str(num_tasks),
        "SLURMD_NODENAME": "localhost",
    }
    return [{**common, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i), "SLURM_NODEID": "0"} for i in range(num_tasks)]


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class Job:
    """The tasks of one run; task 0 is the chief. Output goes to model_dir/../task-<i>.log."""

    def __init__(self, model_dir, envs: list[dict], num_gpus: int, *flags: str):
        self.model_dir = str(model_dir)
        self.logs = [f"{self.model_dir}.task{i}.log" for i in range(len(envs))]
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM") and k != "TF_CONFIG"}
        args = trainer_command(f"--model_dir={self.model_dir}", f"--num_gpus={num_gpus}")
        self.procs = []
        for env, log in zip(envs, self.logs, strict=True):
            with open(log, "w") as out:
                command = [*args, *BASE_FLAGS, *flags]
                self.procs.append(
                    subprocess.Popen(command, cwd=ROOT, env={**base, **env}, stdout=out, stderr=subprocess.STDOUT)
                )

    def wait(self, timeout: float = 300) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"task did not exit in {timeout} s:\n{self.output(0)[-3000:]}") from None
        return codes

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()

    def output(self, task: int) -> str:
        with open(self.logs[task]) as f:
            return f.read()

    def wait_for_step(self, step: int, timeout: float = 180) -> None:
        """Until the chief has logged training step `step` (or later)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = [int(s) for s in re.findall(r"^step\s+(\d+)/", self.output(0), re.M)]
            if done and max(done) >= step:
                return
            if self.procs[0].poll() is not None:
                raise AssertionError(f"the chief exited early:\n{self.output(0)[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"no step {step} in {timeout} s:\n{self.output(0)[-3000:]}")


def slurm_task_pid(job_id: int, task: int) -> int:
    """The pid of trainer task `task` of Slurm job `job_id` on this machine, found by its environment."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        ours = environ.get(b"SLURM_JOB_ID") == str(job_id).encode() and b"-m\0trainer\0" in command
        if ours and environ.get(b"SLURM_PROCID") == str(task).encode():
            return int(pid)
    raise AssertionError(f"no task {task} of job {job_id}")


def metrics(model_dir) -> dict:
    with open(os.path.join(str(model_dir), "metrics.json")) as f:
        return json.load(f)


def train_tags(model_dir) -> set[str]:
    """Every tag the run in `model_dir` wrote to its TensorBoard `train` events."""
    import tensorflow as tf

    tags = set()
    for name in os.listdir(model_dir / "train"):
        for event in tf.compat.v1.train.summary_iterator(str(model_dir / "train" / name)):
            tags.update(value.tag for value in event.summary.value)
    return tags


def grouped_placement(num_tasks: int, towers_per_task: int, placement_name: str):
    """Tasks stood in for by groups of local logical devices, in one process: task t's towers are CPU:t*T ..
    CPU:t*T+T-1 and its CPU is its first tower's device, as on a CPU machine. Variables on the first tower
    or, `spread`, over every tower. Returns (towers, the host of each tower, the `Placement`)."""
    from trainer.system import devices

    towers = tuple(f"/device:CPU:{i}" for i in range(num_tasks * towers_per_task))
    hosts = tuple(towers[t * towers_per_task] for t in range(num_tasks) for _ in range(towers_per_task))
    spread_over = towers if placement_name == "spread" else ()
    return towers, hosts, devices.Placement(towers, towers[0], towers[0], spread_over, hosts, num_tasks)
