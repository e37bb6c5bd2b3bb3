"""`python -m benchmarks.probes tensor_first_step [--models=lm,hub] [--parallel=1,2,4] [--repeats=2] [--steps=3]
[--json=FILE] [--rows=FILE] [--bytes | --trace]`: the start of a tensor-split model against the unsplit one (issue #55
item 6; results: benchmarks/results/tensor-first-step.md).

"The unsplit one at the same T" is the same devices and micro-batches: `--num_gpus=4 --micro_batches=4` on 4
logical CPU devices, split as `--tensor_shards=4 --tensor_parallel=T` (4 / T towers of T devices, each wide layer
in 4 shards) against `--tensor_shards=1` (4 towers, data parallel only), for two models: `lm`, the built-in
language model at its default sizes on its built-in character data, and `hub`, a user's task around Keras Hub's
GPT-2 (benchmarks/harness/hub_tasks.py, split by its built-in plan; keras-hub is a test extra).

Each run is `python -m trainer` itself in a fresh process (what a user waits for), timed from its console as
the parent reads it: build, the seconds from the process's start to its `attempt 1` line (imports, model,
optimizer, input pipeline); first step, the figure the trainer prints (`first step X s (includes graph
tracing)`); later step, the shortest gap between two later step lines (`--log_every_steps=1`). The run is ended
after its last step (its final eval is not timed). Per repeat the unsplit run comes first, then each T, so
each figure's neighbours ran under the same load; the 1-minute load average at each run's start and end is
recorded beside it (`benchmarks.harness.load`), and the trainer process's own CPU-seconds to its `attempt 1`
line and from there to its step 1 line (the figure the load moves least). Prints a Markdown table of medians
(the ratio: the split's first step over the unsplit's) and one of each run's CPU-seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.harness import load
from benchmarks.harness.tensor_parallel_formulas import ACTIVATION_KINDS, Size, megatron_bytes

DEVICES = 4
FIRST = re.compile(r"first step ([0-9.]+) s")
STEP = re.compile(r"^step\s+(\d+)/")


def layouts(parallel: list[int]) -> list[int]:
    """Tensor-parallel degrees in run order: 0 (unsplit) first, then each T."""
    return [0, *parallel]


def command(model: str, parallel: int, model_dir: str, records: tuple[str, str] | None, steps: int) -> list[str]:
    """The trainer's command line for `model` split at `parallel` (0: unsplit, `--tensor_shards=1`)."""
    split = [f"--tensor_parallel={parallel}", f"--tensor_shards={DEVICES}"] if parallel else ["--tensor_shards=1"]
    task = ["--task=lm"]
    if model == "hub":
        task = [
            "--task=benchmarks.harness.hub_tasks:TiedGPT2",
            f"--train_data={records[0]}",
            f"--eval_data={records[1]}",
        ]
    return [
        *(sys.executable, "-m", "trainer", *task, "--device=cpu", f"--num_gpus={DEVICES}", "--micro_batches=4"),
        *split,
        *(f"--train_steps={steps}", "--log_every_steps=1", "--eval_every_steps=0", "--export=false"),
        *("--checkpoint_every_steps=0", f"--model_dir={model_dir}"),
    ]


def parse(lines: list[tuple[float, str]]) -> dict:
    """{build, first, later} seconds from a run's console lines, each with the seconds since its start."""
    build = next(t for t, line in lines if line.startswith("attempt 1 "))
    first = next(float(m.group(1)) for _, line in lines if (m := FIRST.search(line)))
    steps = [t for t, line in lines if STEP.match(line)]
    later = min(b - a for a, b in zip(steps[1:], steps[2:], strict=False)) if len(steps) > 2 else None
    return {"build": build, "first": first, "later": later}


def time_run(argv: list[str], steps: int) -> dict:
    """Runs `argv` until its step `steps` line; its `parse`d times and the load at its start and end."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    begin = load.snapshot([process.pid])
    lines, cpu = [], {}  # cpu: the process's CPU-seconds when it printed its `attempt 1` and step 1 lines
    for line in process.stdout:
        lines.append((time.perf_counter() - start, line.rstrip("\n")))
        mark = "build" if line.startswith("attempt 1 ") else "step" if FIRST.search(line) else None
        if mark:
            cpu[mark] = (load.own_jiffies([process.pid]) or 0) / 100  # jiffies are 1/100 s
        if STEP.match(line) and int(STEP.match(line).group(1)) == steps:
            break
    end = load.snapshot([process.pid])
    process.terminate()  # its final eval is not timed
    process.wait()
    if not any(FIRST.search(line) for _, line in lines):
        raise RuntimeError("the run printed no first step:\n" + "\n".join(line for _, line in lines[-30:]))
    cpu_times = {"build_cpu": cpu["build"], "first_cpu": cpu["step"] - cpu["build"]}
    return {**parse(lines), **cpu_times, **load.window_load(begin, end)}


def run(models: list[str], parallel: list[int], repeats: int, steps: int, root: str) -> list[dict]:
    """Every (model, layout) `repeats` times, the layouts of one repeat in `layouts` order."""
    records = None
    if "hub" in models:
        from benchmarks.harness import hub_tasks

        records = hub_tasks.write_records(root, records=1024)
    rows = []
    for repeat in range(repeats):
        for model in models:
            for t in layouts(parallel):
                model_dir = f"{root}/{model}-{t}-{repeat}"
                row = time_run(command(model, t, model_dir, records, steps), steps)
                rows.append({"model": model, "parallel": t, "repeat": repeat, **row})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: per model and layout the medians of build, first and later step, the first step over the
    unsplit one's, and each run's load average at start / end."""
    out = ["| model | layout | build s | first step s | later step s | first / unsplit first | load (start/end) |"]
    out.append("|---|---|---|---|---|---|---|")
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        base = statistics.median(r["first"] for r in mine if r["parallel"] == 0)
        for t in dict.fromkeys(r["parallel"] for r in mine):
            runs = [r for r in mine if r["parallel"] == t]
            build, first = (statistics.median(r[k] for r in runs) for k in ("build", "first"))
            later = statistics.median(r["later"] for r in runs if r["later"] is not None)
            layout = f"T={t}, N={DEVICES}" if t else "unsplit (N=1)"
            loads = " ".join(f"{r['load_average_start']:.1f}/{r['load_average_end']:.1f}" for r in runs)
            out.append(
                f"| {model} | {layout} | {build:.1f} | {first:.1f} | {later:.2f} | {first / base:.2f} | {loads} |"
            )
    return "\n".join(out)


def cpu_table(rows: list[dict]) -> str:
    """Markdown: each run's CPU-seconds (the trainer process's own) to its `attempt 1` line and from there to its
    step 1 line, and the first step's over that repeat's unsplit run's: the figure least moved by the load."""
    out = ["| model | layout | repeat | build CPU-s | first step CPU-s | first / unsplit first, CPU |"]
    out.append("|---|---|---|---|---|---|")
    for r in rows:
        if "first_cpu" not in r:
            continue
        base = next(x for x in rows if (x["model"], x["repeat"], x["parallel"]) == (r["model"], r["repeat"], 0))
        layout = f"T={r['parallel']}, N={DEVICES}" if r["parallel"] else "unsplit (N=1)"
        ratio = r["first_cpu"] / base["first_cpu"]
        out.append(
            f"| {r['model']} | {layout} | {r['repeat']} | {r['build_cpu']:.1f} | {r['first_cpu']:.1f} | {ratio:.2f} |"
        )
    return "\n".join(out)


def hub_size(micro_batch: int) -> Size:
    """The Keras Hub GPT-2 of benchmarks/harness/hub_tasks.py as the formulas' `Size`."""
    from benchmarks.harness import hub_tasks

    return Size(
        layers=2, heads=hub_tasks.HEADS, width=hub_tasks.WIDTH, context=hub_tasks.CONTEXT, micro_batch=micro_batch
    )


def hub_trainer(towers: dict, root: str):
    """The trainer of the Keras Hub GPT-2 task with `towers` (`TowerConfig`'s fields), on records under `root`."""
    from benchmarks.harness import hub_tasks
    from trainer.loop.build import build
    from trainer.settings import config as cfg

    train_data, eval_data = hub_tasks.write_records(root, records=64)
    model_dir = f"{root}/hub-{len(os.listdir(root))}"
    return build(
        cfg.RunConfig(
            towers=cfg.TowerConfig(device="cpu", **towers),
            loop=cfg.LoopConfig(model_dir=model_dir, train_steps=10, export=False),
            data=cfg.DataConfig(train_data=train_data, eval_data=eval_data),
            task=cfg.TaskConfig(name="benchmarks.harness.hub_tasks:TiedGPT2"),
        )
    )


def hub_bytes(parallel: int, micro_batch: int, root: str) -> dict:
    """One step's bytes between devices of the Keras Hub GPT-2 at N = 4 on one tower of `parallel` devices, by
    kind, beside Megatron's counts (see the docstring)."""
    from benchmarks.harness.tensor_parallel_graph import count

    towers = {"num_towers": parallel, "global_batch_size": micro_batch, "micro_batches": 1}
    trainer = hub_trainer({**towers, "tensor_parallel": parallel, "tensor_shards": DEVICES}, root)
    size = hub_size(micro_batch)
    try:
        counted = count(trainer.updater.step_graph(), trainer.placement.host, size)
    finally:
        trainer.updater.close()
    activations = sum(counted.kinds.get(kind, 0) for kind in ACTIVATION_KINDS)
    return {
        "parallel": parallel,
        "activation": size.activation,
        "total": sum(counted.sent.values()),
        "activations": activations,
        "kinds": dict(counted.kinds),
        "megatron_split_layers": 4 * size.layers * 2 * (parallel - 1) * size.activation,
        "megatron_all": megatron_bytes(size, parallel),
    }


def hub_trace(parallel: int, root: str) -> str:
    """One line: the Keras Hub GPT-2's build and step-trace CPU seconds and its step graph's ops, as the probe's
    runs are laid out (`parallel` 0: unsplit)."""
    import collections

    split = {"tensor_parallel": parallel, "tensor_shards": DEVICES} if parallel else {"tensor_shards": 1}
    start = time.process_time()
    trainer = hub_trainer({"num_towers": DEVICES, "micro_batches": 4, **split}, root)
    built = time.process_time()
    try:
        ops = trainer.updater.step_graph().get_operations()
    finally:
        trainer.updater.close()
    traced = time.process_time()
    top = ", ".join(f"{kind} {n:,}" for kind, n in collections.Counter(op.type for op in ops).most_common(6))
    layout = f"T={parallel}, N={DEVICES}" if parallel else "unsplit (N=1)"
    return f"| {layout} | {built - start:.1f} | {traced - built:.1f} | {len(ops):,} | {top} |"


def bytes_table(rows: list[dict]) -> str:
    """Markdown: each T's counted bytes, in bytes and in units of A, beside Megatron's."""
    out = ["| T | N | total bytes | activations bytes | / A | Megatron, the split blocks / A | Megatron, with the "]
    out[0] += "embedding and head / A | other kinds |"
    out.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        a = r["activation"]
        other = ", ".join(f"{k} {v:,}" for k, v in r["kinds"].items() if k not in ACTIVATION_KINDS) or "none"
        out.append(
            f"| {r['parallel']} | {DEVICES} | {r['total']:,} | {r['activations']:,} | {r['activations'] / a:g} | "
            f"{r['megatron_split_layers'] / a:g} | {r['megatron_all'] / a:g} | {other} |"
        )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes tensor_first_step")
    parser.add_argument("--models", default="lm,hub")
    parser.add_argument("--parallel", default="1,2,4", help="T values (--tensor_parallel), each dividing 4")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="--train_steps of each run (at least 3: a later step)")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--rows", help="print the table of rows a --json run wrote, running nothing")
    parser.add_argument("--bytes", action="store_true", help="count the Keras Hub GPT-2's bytes per step instead")
    parser.add_argument("--trace", action="store_true", help="the Keras Hub GPT-2's trace CPU-s and ops instead")
    parser.add_argument("--micro_batch", type=int, default=8, help="--bytes: sequences in the micro-batch")
    args = parser.parse_args(argv)
    if args.bytes or args.trace:
        from trainer.system import devices

        devices.configure_logical_cpus(DEVICES)
        with tempfile.TemporaryDirectory(prefix="towerflow-hub-") as root:
            if args.bytes:
                print(bytes_table([hub_bytes(t, args.micro_batch, root) for t in (2, 4)]))
            else:
                print("| layout | build CPU-s | step trace CPU-s | step graph ops | most frequent ops |")
                print("|---|---|---|---|---|")
                for t in layouts([int(t) for t in args.parallel.split(",")]):
                    print(hub_trace(t, root), flush=True)
        return 0
    if args.rows:
        rows = json.loads(pathlib.Path(args.rows).read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="towerflow-tensor-first-step-") as root:
            parallel = [int(t) for t in args.parallel.split(",")]
            rows = run(args.models.split(","), parallel, args.repeats, args.steps, root)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    print(table(rows))
    if any("first_cpu" in r for r in rows):
        print("\n" + cpu_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
