"""Submitting towerflow jobs to the N-node test Slurm (tests/support/node_fixture.py) and following their logs, for
tests/launch/test_two_node.py and tests/launch/test_node_counts.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

from tests.support.cluster import BASE_FLAGS
from tests.support.paths import ROOT

# Every state a job ends in (no accounting, no slurmdbd: scontrol shows it while MinJobAge keeps the job).
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def submit(slurm, model_dir, layout, nodes="2", num_gpus=2) -> int:
    """`python -m launch.slurm --nodes=NODES ... -- BASE_FLAGS --num_gpus=G LAYOUT` in a shell of `slurm` (its
    SLURM_CONF), as a user submits; the job id."""
    launcher = [f"--model_dir={model_dir}", f"--nodes={nodes}", "--cpus_per_task=1", "--time=5"]
    command = [sys.executable, "-m", "launch.slurm", *launcher, "--", *BASE_FLAGS, f"--num_gpus={num_gpus}", *layout]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "TF_CONFIG"}
    env.update(slurm.env, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return int(re.search(r"^submitted job (\d+)$", done.stdout, re.MULTILINE)[1])


def log_of(model_dir, job_id) -> str:
    """The job's log (every attempt appends to it), or "" before Slurm has made it."""
    path = model_dir / "slurm" / f"towerflow-{model_dir.name}-{job_id}.log"
    return path.read_text() if path.exists() else ""


def attempts_in_log(log: str, job_id: int) -> list[str]:
    """The log split at each start of the job (`=== towerflow: job J restart R on NODE`), from restart 0 on:
    each part begins with the node the batch shell ran on."""
    return log.split(f"=== towerflow: job {job_id} restart ")[1:]


def wait_for_step_of_restart(model_dir, job_id: int, restart: int, step: int, timeout_sec: float = 240) -> None:
    """Until restart `restart` of the job (0: its first start) has logged training step `step` or later."""
    deadline = time.monotonic() + timeout_sec
    while True:
        parts = attempts_in_log(log_of(model_dir, job_id), job_id)
        part = parts[restart] if len(parts) > restart else ""
        steps = [int(s) for s in re.findall(r"^0: step +(\d+)/", part, re.MULTILINE)]
        if steps and max(steps) >= step:
            return
        assert time.monotonic() < deadline, log_of(model_dir, job_id)[-3000:]
        time.sleep(0.2)


def wait_for_steps_past_resume(model_dir, job_id: int, restart: int, steps: int) -> None:
    """Until restart `restart` of the job has trained `steps` steps past the one it resumed from."""
    wait_for_step_of_restart(model_dir, job_id, restart, 1)  # it has begun: attempts.json has its record
    resumed = json.loads((model_dir / "attempts.json").read_text())[restart]["resumed_from_step"]
    wait_for_step_of_restart(model_dir, job_id, restart, resumed + steps)
