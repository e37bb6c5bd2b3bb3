"""The async comparison: towerflow's `--update_mode=async` on 2 tasks x 1 device against ParameterServerStrategy
(benchmarks/machines/strategies/ps.py: chief, 2 workers, 1 ps) on the same two namespaces and cores.

Layout, matched to towerflow's: towerflow's task 0 is the chief, holds the variables (`--parameter_device=cpu`)
and runs tower 0, on core 0 in namespace 1; task 1 runs tower 1 on core 1 in namespace 2. The peer's chief,
ps and worker 0 share namespace 1 and core 0; worker 1 has namespace 2 and core 1. So on both sides one
"machine" coordinates, keeps the variables and trains, the other trains, and namespace 2's bytes are the
traffic between the two machines. Slowed: the process of the second machine's trainer (towerflow's task 1,
the peer's worker 1) runs 1/3 of the time (`cluster.DutyCycle`), the same on both sides.
"""

from __future__ import annotations

import json
import statistics
import sys

from benchmarks.machines.strategies import cluster as pc
from benchmarks.machines.strategies.sync import RUN_TIMEOUT_SEC, check_codes, run_towerflow
from launch.testslurm.ports import free_ports

EXAMPLES_PER_UPDATE = 64  # towerflow: --global_batch_size=128 / K=2 micro-batches, one update each
STEPS_PER_EXECUTION = 10
SLOW_FACTOR = 3.0
# Pinned (chief, ps and worker 0 on core 0, worker 1 on core 1, as towerflow's two tasks), the peer made no
# progress in 60 s, nor in 180 s on a retry (worker 1 had received 0.5 MB; not diagnosed); unpinned it trains.
# So neither side is pinned here: every process of both sides may use both cores.
PINNED = False


def ps_tasks(updates: int, out: str) -> list[pc.Task]:
    """chief, worker 0, worker 1, ps: all but worker 1 in namespace 1; unpinned (see PINNED)."""
    first, second = pc.addresses(2)
    ports = free_ports(3)
    host = first.split(":")[0]
    chief, worker0, ps = (f"{host}:{p}" for p in ports)
    configs = pc.ps_configs(chief, [worker0, second], [ps])
    argv = [sys.executable, "-m", "benchmarks.machines.strategies.ps", f"--updates={updates}"]
    argv += [f"--examples_per_update={EXAMPLES_PER_UPDATE}", f"--steps={STEPS_PER_EXECUTION}", f"--out={out}.json"]
    cores = pc.pinned_cores([0, 1]) if PINNED else ["", ""]
    places = [(1, cores[0]), (1, cores[0]), (2, cores[1]), (1, cores[0])]
    names = ["chief", "worker0", "worker1", "ps"]
    return [
        pc.Task(argv, c, ns, core, f"{out}.{name}.log")
        for c, (ns, core), name in zip(configs, places, names, strict=True)
    ]


def run_ps(updates: int, out: str, slow: bool = False) -> dict:
    tasks = ps_tasks(updates, out)
    run = pc.run_tasks(tasks, [0], RUN_TIMEOUT_SEC, (2, SLOW_FACTOR) if slow else None)
    if run["codes"][0] != 0:
        check_codes({"codes": [run["codes"][0]]}, tasks)
    with open(f"{out}.json") as f:
        return {**json.load(f), **run}


def run_async(updates: int, model_dir: str, slow: bool = False) -> dict:
    extra = ["--update_mode=async"]
    return run_towerflow(2, 1, updates, model_dir, extra, (1, SLOW_FACTOR) if slow else None, pin=PINNED)


def compare(updates: int, repeats: int, root: str) -> dict:
    """Examples/sec, staleness and namespace 2's bytes of each side, normal and slowed, runs alternating;
    ratios of medians (towerflow / ParameterServerStrategy)."""
    runs: dict[str, list[dict]] = {}
    for r in range(repeats):
        for slow in (False, True):
            tag = "slowed" if slow else "even"
            for side, result in (
                (f"towerflow async {tag}", run_async(updates, f"{root}/tf-{tag}-{r}", slow)),
                (f"ps {tag}", run_ps(updates, f"{root}/ps-{tag}-{r}", slow)),
            ):
                keep = (
                    "examples_per_sec",
                    "staleness_mean",
                    "staleness_max",
                    "loss_before",
                    "loss_after",
                    "train_loss",
                )
                row = {k: result.get(k) for k in keep}
                row["namespace2_bytes"] = {"received": result["received"][1], "sent": result["sent"][1]}
                runs.setdefault(side, []).append(row)
                print(f"{side}: {row}", file=sys.stderr, flush=True)
    medians = {k: statistics.median(r["examples_per_sec"] for r in v) for k, v in runs.items()}
    ratios = {tag: medians[f"towerflow async {tag}"] / medians[f"ps {tag}"] for tag in ("even", "slowed")}
    return {"updates": updates, "repeats": repeats, "slow_factor": SLOW_FACTOR, "runs": runs, "median": medians,
            "ratios": ratios}  # fmt: skip
