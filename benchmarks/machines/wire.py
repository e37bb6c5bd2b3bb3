"""`python -m benchmarks.machines wire`: the bytes each task of a multi-task run sends and receives per training step,
counted by the kernel on that task's own network interface. Needs root.

    python -m benchmarks.machines wire                                    # the whole grid (below)
    python -m benchmarks.machines wire --models=cnn --tasks=2 --towers=1,2 --parameter_device=cpu
    python -m benchmarks.machines wire --models=cnn --tasks=2 --towers=1,2 --update_mode=async --out=...
    python -m benchmarks.machines wire --summarize=benchmarks/results/wire.json     # the compact table, nothing run

Each task of `python -m trainer` (TF_CONFIG, one port per task) runs in its own network namespace
(`launch/testslurm/netns.py`: task i in tfnode<i+1> at 10.78.0.(11+i), behind a veth pair on the bridge br-tf), so its
traffic, and only its, crosses its interface. `benchmarks.machines.multinode` reads `lo` instead: every task merged.

Grid: models {cnn on the digits, resnet50 on 32x32x3 synthetic records} x M tasks {2, 3, 4} x T towers per task
{1, 2, 4} (`--device=cpu --num_gpus=T`, K = M*T micro-batches of 2 examples) x `--parameter_device` {cpu,
spread}. Each cell trains twice, S and 2S steps; per task and direction, bytes per step = (the 2S run's counter
difference - the S run's) / S, so start-up, the final checkpoint and eval cancel out. Each figure is also given
per trainable variable byte, next to 2(M-1)/M: what a ring all-reduce sends, and receives, per task.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib import metadata

from benchmarks.harness import paths
from benchmarks.harness.plan import Setting
from benchmarks.machines.multinode import COMMON, _machine, model_bytes
from launch.testslurm import netns
from launch.testslurm.ports import free_ports

EXAMPLES_PER_MICRO_BATCH = 2
RUN_TIMEOUT_SEC = 1800
PROXY_VARIABLES = ("http_proxy", "https_proxy", "grpc_proxy", "all_proxy")  # gRPC honours these: not here


@dataclasses.dataclass(frozen=True)
class Workload:
    setting: Setting  # the model and its records (its global batch is not used: K x 2 examples here)
    steps: int  # S


WORKLOADS = {
    "cnn": Workload(Setting("wire-cnn", "cnn", (8, 8, 1), 10, 2, "digits", 1437), 20),
    # the records benchmarks.machines.multinode measures its resnet50 bytes on (the same cache)
    "resnet50": Workload(Setting("bytes-resnet50", "resnet50", (32, 32, 3), 10, 4, "synthetic", 512), 5),
}


def _env() -> dict[str, str]:
    drop = {*PROXY_VARIABLES, *(v.upper() for v in PROXY_VARIABLES), "TF_CONFIG"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SLURM")}
    return {**env, "TF_CPP_MIN_LOG_LEVEL": "2"}


def run_job(num_tasks: int, towers: int, flags: list[str], model_dir: str, timeout: float = RUN_TIMEOUT_SEC) -> dict:
    """One training of `num_tasks` tasks, task i in namespace i+1; each task's bytes received and sent over it."""
    workers = [f"{netns.address(i + 1)}:{port}" for i, port in enumerate(free_ports(num_tasks))]
    command = [sys.executable, "-m", "trainer", f"--model_dir={model_dir}", f"--num_gpus={towers}", *flags]
    logs = [f"{model_dir}.task{i}.log" for i in range(num_tasks)]
    before = [netns.read_counters(i + 1) for i in range(num_tasks)]
    start = time.monotonic()
    procs = []
    try:
        for i, log in enumerate(logs):
            tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
            with open(log, "w") as out:
                env = {**_env(), "TF_CONFIG": json.dumps(tf_config)}
                procs.append(
                    netns.run_in(i + 1, command, env, cwd=paths.REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
                )
        codes = _wait(procs, start + timeout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    seconds = time.monotonic() - start
    after = [netns.read_counters(i + 1) for i in range(num_tasks)]
    if codes != [0] * num_tasks:
        raise RuntimeError(f"{num_tasks}-task run failed with {codes}; the chief's log ends:\n{_tail(logs[0])}")
    return {
        "seconds": seconds,
        "received": [a[0] - b[0] for a, b in zip(after, before, strict=True)],
        "sent": [a[1] - b[1] for a, b in zip(after, before, strict=True)],
    }


def _wait(procs: list[subprocess.Popen], deadline: float) -> list[int | None]:
    """Until every task exits, one fails (the others are killed: a worker would wait for its chief), or timeout."""
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if None not in codes or any(c not in (None, 0) for c in codes):
            return codes
        time.sleep(0.2)
    return [p.poll() for p in procs]


def _tail(path: str, chars: int = 3000) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-chars:]


def cell_flags(workload: Workload, records: dict, placement: str, num_tasks: int, towers: int) -> list[str]:
    k = num_tasks * towers
    common = [f for f in COMMON if not f.startswith("--parameter_device=")]
    data = [f"--train_data={records['train']}", f"--eval_data={records['eval']}", "--num_classes=10"]
    batch = [f"--micro_batches={k}", f"--global_batch_size={k * EXAMPLES_PER_MICRO_BATCH}"]
    # Eval in one batch of the whole eval set: with oneDNN (TF 2.21) a tower whose part of a short last batch
    # is empty fails in BatchNorm ("Incompatible shapes: [64] vs. [0,8,8,32]"), e.g. 16 towers, batch 32.
    batch.append(f"--eval_batch_size={_eval_examples(records)}")
    return [*common, f"--parameter_device={placement}", f"--model={workload.setting.model}", *data, *batch]


def _eval_examples(records: dict) -> int:
    with open(os.path.join(os.path.dirname(records["eval"]), "info.json")) as f:
        return json.load(f)["counts"]["eval"]


def measure(workload, records, placement, num_tasks, towers, variable_bytes, root, steps=None, mode="sync") -> dict:
    """One cell: runs of S and 2S steps; bytes per step per task and direction, and per variable byte."""
    steps = steps or workload.steps
    flags = [*cell_flags(workload, records, placement, num_tasks, towers), f"--update_mode={mode}"]
    name = f"{root}/{workload.setting.model}-{placement}-{mode}-{num_tasks}x{towers}"
    short = run_job(num_tasks, towers, [*flags, f"--train_steps={steps}"], f"{name}-s{steps}")
    long = run_job(num_tasks, towers, [*flags, f"--train_steps={2 * steps}"], f"{name}-s{2 * steps}")
    per_task = []
    for task in range(num_tasks):
        received = (long["received"][task] - short["received"][task]) / steps
        sent = (long["sent"][task] - short["sent"][task]) / steps
        per_task.append(
            {
                "task": task,
                "received_per_step": received,
                "sent_per_step": sent,
                "received_per_variable_byte": received / variable_bytes,
                "sent_per_variable_byte": sent / variable_bytes,
            }
        )
    return {
        "model": workload.setting.model,
        "parameter_device": placement,
        "update_mode": mode,
        "tasks": num_tasks,
        "towers_per_task": towers,
        "micro_batches": num_tasks * towers,
        "steps": steps,
        "trainable_variable_bytes": variable_bytes,
        "ring_bound": 2 * (num_tasks - 1) / num_tasks,
        "seconds": {"short": short["seconds"], "long": long["seconds"]},
        "per_task": per_task,
    }


def table(cells: list[dict]) -> str:
    lines = [
        "| model | params | M | T | task | received B/step | sent B/step | received / var | sent / var "
        "| 2(M-1)/M | s (S, 2S runs) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        seconds = f"{c['seconds']['short']:.0f}, {c['seconds']['long']:.0f}"
        for t in c["per_task"]:
            lines.append(
                f"| {c['model']} | {_params(c)} | {c['tasks']} | {c['towers_per_task']} | {t['task']} "
                f"| {t['received_per_step']:,.0f} | {t['sent_per_step']:,.0f} | {t['received_per_variable_byte']:.3f} "
                f"| {t['sent_per_variable_byte']:.3f} | {c['ring_bound']:.2f} | {seconds} |"
            )
    return "\n".join(lines)


def compact(cells: list[dict]) -> str:
    """One line per model, placement and M: the busiest task's bytes per step per variable byte (the larger
    direction) for each T, their spread over T, and the ratio of the worst to the bound 2(M-1)/M."""
    groups: dict[tuple, dict[int, float]] = {}
    for c in cells:
        worst = max(max(t["received_per_variable_byte"], t["sent_per_variable_byte"]) for t in c["per_task"])
        groups.setdefault((c["model"], _params(c), c["tasks"], c["ring_bound"]), {})[c["towers_per_task"]] = worst
    lines = ["| model | params | M | busiest task, T=1 / 2 / 4 | max/min over T | 2(M-1)/M | worst / bound |"]
    lines.append("|---|---|---|---|---|---|---|")
    for (model, params, m, bound), by_t in groups.items():
        values = [by_t[t] for t in sorted(by_t)]
        lines.append(
            f"| {model} | {params} | {m} | {' / '.join(f'{v:.2f}' for v in values)} "
            f"| {max(values) / min(values):.3f} | {bound:.2f} | {max(values) / bound:.2f} |"
        )
    return "\n".join(lines)


def _params(cell: dict) -> str:
    mode = cell.get("update_mode", "sync")
    return cell["parameter_device"] + ("" if mode == "sync" else f", {mode}")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.machines wire", description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=_names, default=list(WORKLOADS), help="comma-separated: cnn,resnet50")
    parser.add_argument("--tasks", type=_ints, default=[2, 3, 4], help="M, comma-separated (each >= 2)")
    parser.add_argument("--towers", type=_ints, default=[1, 2, 4], help="T towers per task, comma-separated")
    parser.add_argument("--parameter_device", type=_names, default=["cpu", "spread"], help="cpu, gpu, spread")
    parser.add_argument("--update_mode", type=_names, default=["sync"], help="sync, async (comma-separated)")
    parser.add_argument("--summarize", metavar="JSON", help="print the compact table of a results file; run nothing")
    parser.add_argument("--steps", type=int, default=0, help="S for every model (0: cnn 20, resnet50 5)")
    parser.add_argument("--out", default=paths.result_path("wire.json"))
    return parser


def _check(args, parser) -> None:
    if unknown := [m for m in args.models if m not in WORKLOADS]:
        parser.error(f"--models: unknown {unknown}; choose from {list(WORKLOADS)}")
    if unknown := [p for p in args.parameter_device if p not in ("cpu", "gpu", "spread")]:
        parser.error(f"--parameter_device: unknown {unknown}; choose from cpu, gpu, spread")
    if unknown := [m for m in args.update_mode if m not in ("sync", "async")]:
        parser.error(f"--update_mode: unknown {unknown}; choose from sync, async")
    if not args.tasks or min(args.tasks) < 2 or not args.towers or min(args.towers) < 1:
        parser.error("--tasks: each at least 2; --towers: each at least 1")


def run_grid(args, results: dict) -> None:
    """Every cell of the grid in turn (one training at a time: they share the cores), saved after each."""
    from benchmarks.harness.records import ensure_records  # noqa: PLC0415 (as benchmarks.machines.multinode)

    prepared = {}
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as root:
        for model, mode, placement, num_tasks, towers in itertools.product(
            args.models, args.update_mode, args.parameter_device, args.tasks, args.towers
        ):
            workload = WORKLOADS[model]
            if model not in prepared:
                prepared[model] = (
                    ensure_records(workload.setting),
                    model_bytes(model, workload.setting.example_shape)[0],
                )
            records, trainable = prepared[model]
            cell = measure(workload, records, placement, num_tasks, towers, trainable, root, args.steps, mode)
            results["cells"].append(cell)
            results["total_seconds"] = time.monotonic() - began
            _save(results, args.out)
            print("\n".join(table([cell]).splitlines()[2:]), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.summarize:
        with open(args.summarize) as f:
            print(compact(json.load(f)["cells"]))
        return
    _check(args, parser)
    results = {"machine": _machine(), "tensorflow": metadata.version("tensorflow"), "cells": []}
    netns.up(max(args.tasks))
    try:
        run_grid(args, results)
    finally:
        netns.down()
    print(table(results["cells"]))
    print(compact(results["cells"]))
    print(f"\n{len(results['cells'])} cells in {results['total_seconds'] / 60:.1f} min; JSON: {args.out}")


def _save(results: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
