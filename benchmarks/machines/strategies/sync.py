"""The sync comparison: towerflow's M tasks x T devices against `MultiWorkerMirroredStrategy` + Keras `fit`
(benchmarks/machines/strategies/mwms.py) on the same namespaces and cores, the same model, batch and optimizer.

MWMS takes ONE CPU device per worker whatever the logical devices (TensorFlow 2.21's
`CollectiveAllReduceExtended._initialize_local_devices`: no GPU -> `num_local_devices = 1`), so its layouts
are M x 1: "2x2" is towerflow's only; MWMS's 4 replicas need 4 worker processes (4x1).
"""

from __future__ import annotations

import json
import os
import statistics
import sys

from benchmarks.machines.multinode import COMMON
from benchmarks.machines.strategies import cluster as pc

RUN_TIMEOUT_SEC = 600
GLOBAL_BATCH = 128
STEPS_PER_EXECUTION = 20


def towerflow_tasks(num_tasks: int, towers: int, steps: int, model_dir: str, extra=(), pin=True) -> list[pc.Task]:
    """`python -m trainer` on `num_tasks` namespaces, task i pinned to its share of the cores (`pin`)."""
    argv = [sys.executable, "-m", "trainer", f"--model_dir={model_dir}", f"--num_gpus={towers}", *COMMON]
    argv += ["--model=cnn", f"--global_batch_size={GLOBAL_BATCH}", f"--train_steps={steps}", *extra]
    configs = pc.worker_configs(pc.addresses(num_tasks)) if num_tasks > 1 else [None]
    cores = pc.pinned_cores(list(range(num_tasks))) if pin else [""] * num_tasks
    return [pc.Task(argv, c, i + 1, cores[i], f"{model_dir}.task{i}.log") for i, c in enumerate(configs)]


def mwms_tasks(num_tasks: int, steps: int, out: str, deterministic=False, extra=(), pin=True) -> list[pc.Task]:
    """The MWMS peer on `num_tasks` namespaces (one task: MWMS's local mode, no TF_CONFIG); task i writes
    `{out}.task{i}.json`."""
    argv = [sys.executable, "-m", "benchmarks.machines.strategies.mwms", f"--steps={steps}"]
    argv += [f"--global_batch_size={GLOBAL_BATCH}", f"--steps_per_execution={STEPS_PER_EXECUTION}"]
    argv += ["--deterministic"] if deterministic else []
    argv += list(extra)
    configs = pc.worker_configs(pc.addresses(num_tasks)) if num_tasks > 1 else [None]
    groups = [i * 2 // num_tasks for i in range(num_tasks)] if num_tasks > 2 else list(range(num_tasks))
    cores = pc.pinned_cores(groups) if pin else [""] * num_tasks
    return [
        pc.Task([*argv, f"--out={out}.task{i}.json"], c, i + 1, cores[i], f"{out}.task{i}.log")
        for i, c in enumerate(configs)
    ]


def run_towerflow(num_tasks, towers, steps, model_dir, extra=(), slow=None, pin=True) -> dict:
    """One towerflow run: the chief's metrics.json figures and each task's bytes (`slow`: `run_tasks`'s)."""
    tasks = towerflow_tasks(num_tasks, towers, steps, model_dir, extra, pin)
    run = pc.run_tasks(tasks, list(range(num_tasks)), RUN_TIMEOUT_SEC, slow)
    check_codes(run, tasks)
    with open(os.path.join(model_dir, "metrics.json")) as f:
        metrics = json.load(f)
    keep = ("examples_per_sec", "weights_sha256", "staleness_mean", "staleness_max", "train_loss", "global_step")
    return {**{k: metrics[k] for k in keep if k in metrics}, **run}


def run_mwms(num_tasks: int, steps: int, out: str, deterministic=False, extra=(), pin=True) -> dict:
    """One MWMS run: the chief's (task 0's) JSON, every task's weights hash, and each task's bytes."""
    tasks = mwms_tasks(num_tasks, steps, out, deterministic, extra, pin)
    run = pc.run_tasks(tasks, list(range(num_tasks)), RUN_TIMEOUT_SEC)
    check_codes(run, tasks)
    results = []
    for i in range(num_tasks):
        with open(f"{out}.task{i}.json") as f:
            results.append(json.load(f))
    return {
        **results[0],
        "task_hashes": [r["weights_sha256"] for r in results],
        "task_trainable_hashes": [r["trainable_sha256"] for r in results],
        **run,
    }


def check_codes(run: dict, tasks: list[pc.Task]) -> None:
    """Raises RuntimeError with task 0's log tail unless every exit code in `run` is 0."""
    if any(c != 0 for c in run["codes"]):
        raise RuntimeError(f"run failed with exit codes {run['codes']}; task 0's log ends:\n{pc.tail(tasks[0].log)}")


# name -> (towerflow's M, T; MWMS's M): MWMS has one device per worker, so its 4 replicas are 4 workers
PAIRS = {"2x1": ((2, 1), 2), "2x2": ((2, 2), 2), "2x2_vs_mwms4x1": ((2, 2), 4)}


def throughput(steps: int, repeats: int, root: str, pairs=tuple(PAIRS)) -> dict:
    """Examples/sec of each side of each pair, runs alternating (towerflow, MWMS, next pair, ...), repeated;
    ratios of medians (towerflow / MWMS) and each run's bytes per step, start-up included."""
    rates: dict[str, list[float]] = {}
    for r in range(repeats):
        for name in pairs:
            (m, t), peer = PAIRS[name]
            for side, result in (
                (f"towerflow {m}x{t}", run_towerflow(m, t, steps, f"{root}/tf-{name}-{r}")),
                (f"mwms {peer}x1", run_mwms(peer, steps, f"{root}/mwms-{name}-{r}")),
            ):
                rates.setdefault(side, []).append(result["examples_per_sec"])
                print(f"{side}: {result['examples_per_sec']:.0f} ex/s", file=sys.stderr, flush=True)
    medians = {k: statistics.median(v) for k, v in rates.items()}
    ratios = {}
    for name in pairs:
        (m, t), peer = PAIRS[name]
        ratios[f"towerflow {m}x{t} / mwms {peer}x1"] = medians[f"towerflow {m}x{t}"] / medians[f"mwms {peer}x1"]
    return {"steps": steps, "repeats": repeats, "examples_per_sec": rates, "median": medians, "ratios": ratios}


def bytes_per_step(short: dict, long: dict, steps: int, variable_bytes: int) -> list[dict]:
    """Per task and direction: (the 2S run's bytes - the S run's) / S, and that over the ring bound."""
    bound = pc.ring_bound(len(short["received"]), variable_bytes)
    rows = []
    for task, (r0, r1, s0, s1) in enumerate(
        zip(short["received"], long["received"], short["sent"], long["sent"], strict=True)
    ):
        received, sent = (r1 - r0) / steps, (s1 - s0) / steps
        rows.append({"task": task, "received": received, "sent": sent, "received_bound": received / bound,
                     "sent_bound": sent / bound})  # fmt: skip
    return rows


def wire(steps: int, root: str, variable_bytes: int) -> dict:
    """Bytes per step per task of towerflow 2x1, 2x2 and MWMS 2x1, 4x1 (runs of S and 2S steps)."""
    cells = {}
    for name, make in (
        ("towerflow 2x1", lambda s, d: run_towerflow(2, 1, s, d)),
        ("towerflow 2x2", lambda s, d: run_towerflow(2, 2, s, d)),
        ("mwms 2x1", lambda s, d: run_mwms(2, s, d)),
        ("mwms 4x1", lambda s, d: run_mwms(4, s, d)),
    ):
        tag = name.replace(" ", "-")
        short, long = make(steps, f"{root}/w-{tag}-{steps}"), make(2 * steps, f"{root}/w-{tag}-{2 * steps}")
        tasks = len(short["received"])
        cells[name] = {"tasks": tasks, "ring_bound_bytes": pc.ring_bound(tasks, variable_bytes),
                       "per_task": bytes_per_step(short, long, steps, variable_bytes)}  # fmt: skip
        print(f"{name}: {cells[name]['per_task']}", file=sys.stderr, flush=True)
    return {"steps": steps, "trainable_variable_bytes": variable_bytes, "cells": cells}


def hashes(steps: int, root: str) -> dict:
    """Final weights' SHA-256 with op determinism, every task unpinned with TensorFlow's default intra-op
    threads (one per core: on CPU the bits follow the thread count, docs/determinism.md; towerflow refuses
    `--intra_op_threads` in a multi-task run): MWMS 1x1 (local), 2x1 and 4x1 (same global batch);
    towerflow 2x2 and 1x4 with --deterministic."""
    out = {}
    for m in (1, 2, 4):
        run = run_mwms(m, steps, f"{root}/h-mwms-{m}", True, pin=False)
        out[f"mwms {m}x1"] = {"all": run["task_hashes"], "trainable": run["task_trainable_hashes"]}
    for m, t in ((2, 2), (1, 4)):
        run = run_towerflow(m, t, steps, f"{root}/h-tf-{m}x{t}", ["--deterministic"], pin=False)
        out[f"towerflow {m}x{t}"] = {"all": [run["weights_sha256"]]}
    return {"steps": steps, "pinned": False, "weights_sha256": out}
