"""The sync comparison as 2-node Slurm jobs on launch/testslurm/node_slurm.py's nodes (tfn1, tfn2: a slurmd each, in
network namespaces of their own): towerflow's own launcher (`python -m launch.slurm --nodes=2 -- FLAGS`)
against benchmarks/machines/strategies/mwms.sbatch, the script a user would write for MultiWorkerMirroredStrategy.

    python -m benchmarks.machines peers slurm --steps=400
    python -m benchmarks.machines.strategies.slurm tf_config      # inside a task of a job: its TF_CONFIG, as JSON

The peer's TF_CONFIG comes from Slurm's variables (`tf_config`): the workers are the job's nodes (one task per
node) on a port derived from the job id, the task index is SLURM_PROCID. One job each side, one after the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import paths
from benchmarks.machines.multinode import COMMON

BASE_PORT = 21000  # + job id mod 1000: two jobs of this Slurm never share a port; launch.job.cluster uses 12000+
SBATCH = Path(__file__).with_name("mwms.sbatch")
GLOBAL_BATCH = 128
JOB_TIMEOUT_SEC = 600
# Every state a job ends in (as tests/support/node_jobs.py's DONE: scontrol shows it while MinJobAge keeps the job)
DONE_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def tf_config(environ: dict[str, str], hostnames: list[str]) -> dict:
    """The TF_CONFIG of the Slurm task described by `environ` (SLURM_JOB_ID, SLURM_PROCID, SLURM_NTASKS)
    in a job on `hostnames` (its nodes, in Slurm's order), one task per node.

    Raises:
        ValueError: a variable is missing, or the job has more tasks than nodes.
    """
    missing = [v for v in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS") if v not in environ]
    if missing:
        raise ValueError(f"not in a Slurm task: {', '.join(missing)} unset; run it under srun")
    if int(environ["SLURM_NTASKS"]) != len(hostnames):
        raise ValueError(f"{environ['SLURM_NTASKS']} tasks on {len(hostnames)} nodes: use --ntasks-per-node=1")
    port = BASE_PORT + int(environ["SLURM_JOB_ID"]) % 1000
    workers = [f"{host}:{port}" for host in hostnames]
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": int(environ["SLURM_PROCID"])}}


def hostnames(nodelist: str) -> list[str]:
    """`scontrol show hostnames NODELIST`: tfn[1-2] -> [tfn1, tfn2]."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def _env(slurm) -> dict[str, str]:
    """The submitting shell's environment: no SLURM_* or TF_CONFIG of ours, the node Slurm's SLURM_CONF, and
    PYTHONPATH on this checkout (Slurm hands the environment to the job)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "TF_CONFIG"}
    return {**env, **slurm.env, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": paths.REPO_ROOT}


def submit_towerflow(slurm, model_dir: str, steps: int, towers: int) -> int:
    """`python -m launch.slurm --nodes=2 -- FLAGS`, the same flags as `peers sync`'s towerflow side."""
    flags = [*COMMON, "--model=cnn", f"--global_batch_size={GLOBAL_BATCH}", f"--train_steps={steps}"]
    command = [sys.executable, "-m", "launch.slurm", f"--model_dir={model_dir}", "--nodes=2", "--cpus_per_task=1"]
    command += ["--time=10", "--", *flags, f"--num_gpus={towers}"]
    done = subprocess.run(command, cwd=paths.REPO_ROOT, env=_env(slurm), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"launch.slurm failed: {done.stdout}{done.stderr}")
    return int(done.stdout.split("submitted job ")[1].split()[0])


def submit_mwms(slurm, out: str, steps: int) -> int:
    """`sbatch --nodes=2 mwms.sbatch STEPS OUT`, as a user submits it."""
    command = ["sbatch", "--parsable", "--nodes=2", f"--output={out}/mwms-%j.log", str(SBATCH), str(steps), out]
    done = subprocess.run(command, cwd=paths.REPO_ROOT, env=_env(slurm), capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"sbatch failed: {done.stdout}{done.stderr}")
    return int(done.stdout.strip().split(";")[0])


def _state(slurm, job_id: int) -> dict:
    """The ended job as `scontrol show job` has it, and what `sacct` says (this Slurm keeps no accounting)."""
    info = slurm.wait_for_state(job_id, DONE_STATES, JOB_TIMEOUT_SEC)
    sacct = subprocess.run(["sacct", "-j", str(job_id), "-n", "-P", "-o", "JobID,State,ExitCode,Elapsed"],
                           env=slurm.env, capture_output=True, text=True)  # fmt: skip
    keep = ("JobState", "ExitCode", "NumNodes", "NumTasks", "NodeList", "RunTime")
    return {**{k: info.get(k) for k in keep}, "sacct": (sacct.stdout + sacct.stderr).strip()}


def compare(steps: int, root: str) -> dict:
    """One towerflow job (2 nodes x 1 device) and one MWMS job on the 2-node Slurm; each one's examples/sec
    and ended state. Brings the Slurm up (and down after, if it started it here)."""
    from launch.testslurm import node_slurm  # noqa: PLC0415

    slurm = node_slurm.up(2)
    out = {}
    try:
        model_dir = f"{root}/towerflow"
        began = time.monotonic()
        job = submit_towerflow(slurm, model_dir, steps, 1)
        state = _state(slurm, job)
        with open(f"{model_dir}/metrics.json") as f:
            metrics = json.load(f)
        seconds = time.monotonic() - began
        out["towerflow 2x1"] = {"job": job, "state": state, "examples_per_sec": metrics["examples_per_sec"],
                                "seconds": seconds, "weights_sha256": metrics["weights_sha256"]}  # fmt: skip
        os.makedirs(f"{root}/mwms", exist_ok=True)
        began = time.monotonic()
        job = submit_mwms(slurm, f"{root}/mwms", steps)
        state = _state(slurm, job)
        with open(f"{root}/mwms/mwms-{job}.task0.json") as f:
            chief = json.load(f)
        seconds = time.monotonic() - began
        out["mwms 2x1"] = {"job": job, "state": state, "examples_per_sec": chief["examples_per_sec"],
                           "seconds": seconds, "loss": [chief["loss_before"], chief["loss_after"]]}  # fmt: skip
    finally:
        if slurm.started_here:
            node_slurm.down()
    out["ratio towerflow / mwms"] = out["towerflow 2x1"]["examples_per_sec"] / out["mwms 2x1"]["examples_per_sec"]
    return {"steps": steps, "jobs": out}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["tf_config"]:
        print("usage: python -m benchmarks.machines.strategies.slurm tf_config  (inside a Slurm task)", file=sys.stderr)
        return 2
    try:
        config = tf_config(dict(os.environ), hostnames(os.environ.get("SLURM_JOB_NODELIST", "")))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
