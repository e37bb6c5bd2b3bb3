"""`python -m benchmarks.probes tensor_parallel [--layers=4] [--heads=8] [--width=256] [--context=128]
[--micro_batch=4] [--shards=4] [--parallel=1,2,4] [--time_steps=5] [--windows=3] [--per_layer] [--devices=4]
[--json=FILE] [--rows=FILE]`: what `--tensor_parallel=T` costs and saves for the built-in LM (`--task=lm`) on
byte tokens (vocabulary 256) it prepares from the built-in corpus, one tower (no data parallelism), K = 1
micro-batch, AdamW, on `--devices` logical CPU devices (docs/tensor_parallel.md; results:
benchmarks/results/tensor-parallel.md).

Per layout (T = each of `--parallel` with N = `--shards`, and T = 1 with N = 1, the model without shards):
- memory per device, as `--device_memory_mb` counts it (`device_memory.needs`): state (variables, AdamW's two
  slots, gradients) beside `state_formula`, the activations one micro-batch keeps for its backward, and what
  any gradient op (the tape's or a shard's own) reads of what the device's forward made;
- the bytes each device sends and receives per step, counted from the traced step graph as `traffic.count`
  walks it (an unknown dimension at its size), by kind (`benchmarks.harness.tensor_parallel_graph`), beside
  the design's formula (`towerflow_bytes`: every split block's input copied to the other devices, its partials
  summed along the tree, forward and backward, plus the ids, targets and the softmax's numbers per position)
  and Megatron's (`megatron_bytes`: 4 ring all-reduces of A per layer plus the embedding's and the head's); with
  `--per_layer`, each T built again at one layer fewer: what one layer moves, beside `layer_formula` (what the
  traced step moves, exactly) and the design's;
- with `--time_steps`, each layout in a fresh subprocess: the first step's CPU-seconds since the build began
  (build, trace, one step), then examples/s, the median of `--windows` windows after an untimed one;
- a projection for 8 GPUs by formula (`project`), not measured.

Nothing here is a GPU figure: the logical devices share the machine's cores.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.harness.tensor_parallel_formulas import (  # noqa: F401 (the probe's test reads them here)
    ACTIVATION_KINDS,
    FLOAT,
    GPU,
    INT,
    MFU,
    PEAK,
    VOCAB,
    Size,
    busiest_per_block,
    copies,
    layer_formula,
    megatron_bytes,
    moved_activations,
    project,
    state_formula,
    towerflow_bytes,
    tree_crossings,
)
from benchmarks.harness.tensor_parallel_graph import count


def byte_records(root: str, context: int) -> str:
    """Byte-token records of the built-in corpus, at `context` (every record full); returns the train glob."""
    from data import prepare
    from data import text as text_data

    path = pathlib.Path(root)
    (path / "text.txt").write_text(text_data.default_corpus()[0][:40000], encoding="utf-8")
    argv = ["text", str(path / "text.txt"), str(path / "records"), f"--context={context}", "--tokens=byte"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert prepare.main(argv) == 0
    return str(path / "records" / "train-*")


def build(size: Size, parallel: int, shards: int, train_data: str, model_dir: str):
    """The trainer of one tower of `parallel` logical CPU devices, every wide layer in `shards` shards."""
    from trainer.loop.build import build as build_trainer
    from trainer.settings import config as cfg

    towers = cfg.TowerConfig(
        num_towers=parallel,
        device="cpu",
        global_batch_size=size.micro_batch,
        micro_batches=1,
        tensor_parallel=parallel,
        tensor_shards=shards,
    )
    options = {"layers": size.layers, "heads": size.heads, "width": size.width, "context": size.context}
    config = cfg.RunConfig(
        towers=towers,
        loop=cfg.LoopConfig(model_dir=model_dir, train_steps=1000, export=False),
        data=cfg.DataConfig(train_data=train_data, eval_data=train_data),  # eval: not read here
        task=cfg.TaskConfig(name="lm", options=options),
        optimizer=cfg.OptimizerConfig(name="adamw"),
    )
    return build_trainer(config)


def measure(
    size: Size, parallel: int, shards: int, train_data: str, model_dir: str, time_steps: int = 0, windows: int = 3
) -> dict:
    """One layout's row: memory and traffic per device (MiB, bytes) and, with `time_steps`, its speed."""
    from trainer.step.memory import device_memory

    cpu_start, wall_start = time.process_time(), time.perf_counter()
    trainer = build(size, parallel, shards, train_data, model_dir)
    row = {"parallel": parallel, "shards": shards, "build_sec": time.perf_counter() - wall_start}
    try:
        if time_steps:
            row.update(_speed(trainer.updater, time_steps, cpu_start, windows))
        needs = device_memory.needs(trainer.updater, trainer.optimizer, size.context + 1)
        row["devices"] = [_short(n.device) for n in needs]
        row["state"] = [n.state for n in needs]
        row["kept"] = [n.kept * n.in_flight for n in needs]
        graph = trainer.updater.step_graph()
        counted = count(graph, trainer.placement.host, size)
        row["sent"] = {d: counted.sent.get(d, 0) for d in row["devices"]}
        row["received"] = {d: counted.received.get(d, 0) for d in row["devices"]}
        row["unknown_edges"] = counted.unknown
        row["kinds"] = dict(counted.kinds)
        row["kept_any_backward"] = [counted.kept_for_backward(graph, d) for d in row["devices"]]
        row["parameters"] = sum(int(math.prod(v.shape)) for v in trainer.model.trainable_variables)
    finally:
        trainer.updater.close()
    return row


def _speed(updater, steps: int, cpu_start: float, windows: int = 3) -> dict:
    """The first step's CPU-seconds since the build began (build + trace + one step) and its wall seconds; then
    one untimed window of `steps` (a window of several steps traces its own function), then examples/s, the
    median of `windows` windows of `steps`."""
    start = time.perf_counter()
    updater.train_steps(1)
    first = {"first_step_cpu_sec": time.process_time() - cpu_start, "first_step_sec": time.perf_counter() - start}
    updater.train_steps(steps)
    rates = []
    for _ in range(windows):
        start = time.perf_counter()
        updater.train_steps(steps)
        rates.append(steps * updater.examples_per_step / (time.perf_counter() - start))
    return {**first, "examples_per_sec": statistics.median(rates), "rates": rates}


def _short(device: str) -> str:
    return device.rsplit("device:", 1)[-1]


# --- running ----------------------------------------------------------------------------------------------------


def layouts(parallel: list[int], shards: int) -> list[tuple[int, int]]:
    return [(1, 1)] + [(t, shards) for t in parallel]


def _worker(args) -> None:
    from trainer.system import devices

    devices.configure_logical_cpus(args.devices)
    size = _size(args)
    with tempfile.TemporaryDirectory() as root:
        train_data = byte_records(root, size.context)
        for parallel, shards, *layers in _worker_layouts(args):
            sized = dataclasses.replace(size, layers=layers[0]) if layers else size
            model_dir = f"{root}/run{parallel}_{shards}_{sized.layers}"
            row = measure(sized, parallel, shards, train_data, model_dir, args.time_steps, args.windows)
            print(json.dumps({**row, "layers": sized.layers}), flush=True)


def _worker_layouts(args) -> list[tuple[int, ...]]:
    """`--worker=TxN[xL],...`: T, N and optionally the layers (default `--layers`)."""
    return [tuple(int(x) for x in layout.split("x")) for layout in args.worker.split(",")]


def _size(args) -> Size:
    return Size(args.layers, args.heads, args.width, args.context, args.micro_batch)


def run(args, argv: list[str]) -> list[dict]:
    """Every layout, each in a fresh subprocess when timed (a first step that traced nothing before), else all
    in one."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    parallel = [int(t) for t in args.parallel.split(",")]
    every = layouts(parallel, args.shards)
    if args.per_layer:  # the same at one layer fewer: what one layer moves, by difference
        every += [(t, args.shards, args.layers - 1) for t in parallel if t > 1]
    batches = [every] if not args.time_steps else [[layout] for layout in every]
    rows = []
    for batch in batches:
        worker = ",".join("x".join(str(x) for x in layout) for layout in batch)
        command = [sys.executable, "-m", "benchmarks.probes", "tensor_parallel", f"--worker={worker}", *argv]
        out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
        rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows


def report(size: Size, rows: list[dict]) -> str:
    """Markdown tables: memory, traffic (with the per-layer check when rows at one layer fewer exist), speed and
    the projection."""
    full = [r for r in rows if r.get("layers", size.layers) == size.layers]
    return "\n\n".join(
        [_memory_table(size, full), _traffic_table(size, full), _layer_table(size, rows)]
        + ([_speed_table(size, full)] if "examples_per_sec" in full[0] else [])
        + [_projection_table()]
    )


def _markdown(header: list[str], body: list[list]) -> str:
    """A Markdown table of `header` and the rows of cells `body`."""
    lines = [header, ["---"] * len(header), *body]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)


def _memory_table(size: Size, rows: list[dict]) -> str:
    mib, nan = 1 << 20, float("nan")  # nan: a row written before the column existed
    body = []
    for r in rows:
        formula = state_formula(size, r["parallel"], r["shards"])
        backward = r.get("kept_any_backward", [nan] * len(r["devices"]))
        for i, device in enumerate(r["devices"]):
            state, kept = r["state"][i], r["kept"][i]
            numbers = (state, formula[i], kept, state + kept, backward[i])
            body.append([r["parallel"], r["shards"], device, *(f"{n / mib:.2f}" for n in numbers)])
    header = "T,N,device,state MiB,formula MiB,kept activations MiB,total MiB,read by any backward MiB"
    return _markdown(header.split(","), body)


def _traffic_table(size: Size, rows: list[dict]) -> str:
    kinds = (*ACTIVATION_KINDS, "weights", "embedding gradient", "scalars")
    body = []
    for r in rows:
        t = r["parallel"]
        scheme = sum(towerflow_bytes(size, t).values()) if r["shards"] > 1 else 0
        numbers = [sum(r["sent"].values())] + [r["kinds"].get(k, 0) for k in kinds]
        numbers += [scheme, megatron_bytes(size, t)]
        per_device = [" / ".join(f"{v / 1e6:.3f}" for v in r[way].values()) for way in ("sent", "received")]
        body.append([t, r["shards"], *per_device, *(f"{n / 1e6:.3f}" for n in numbers)])
    header = ["T", "N", "sent MB per device", "received MB per device", "total MB"]
    header += [f"{kind} MB" for kind in kinds] + ["scheme formula MB", "Megatron MB"]
    return _markdown(header, body)


def _layer_table(size: Size, rows: list[dict]) -> str:
    """What one layer adds (rows at `layers` minus rows at `layers - 1`), beside the formulas, in units of A."""
    by = {(r["parallel"], r["shards"], r.get("layers", size.layers)): r for r in rows}
    body = []
    for (t, n, layers), r in sorted(by.items()):
        less = by.get((t, n, layers - 1))
        if layers != size.layers or less is None:
            continue
        moved = moved_activations(r) - moved_activations(less)
        formula = layer_formula(size, t, n)
        first = [(r[k]["CPU:0"] - less[k]["CPU:0"]) / size.activation for k in ("sent", "received")]
        units = (moved, formula["counted"], formula["scheme"])
        body.append(
            [t, n, f"{moved:,}", *(f"{u / size.activation:g}" for u in units), f"{first[0]:.2f} / {first[1]:.2f}"]
        )
    header = ["T", "N", "one layer's activation bytes", "/ A", "formula (traced) / A", "scheme = Megatron / A"]
    return _markdown(header + ["first device sent / received per layer, / A (activations + weights)"], body)


def _speed_table(size: Size, rows: list[dict]) -> str:
    body = [
        [r["parallel"], r["shards"], f"{r['examples_per_sec']:.1f}", f"{size.micro_batch / r['examples_per_sec']:.3f}"]
        + [f"{r['first_step_cpu_sec']:.1f}", f"{r['first_step_sec']:.1f}", " ".join(f"{x:.1f}" for x in r["rates"])]
        for r in rows
    ]
    header = ["T", "N", "examples/s (logical CPU devices)", "s/step", "first step CPU-s (build + trace + step)"]
    return _markdown(header + ["first step s", "each window's examples/s"], body)


def _projection_table() -> str:
    links = list(GPU)
    body = [
        [r["scheme"], f"{r['busiest_bytes'] / 1e9:.2f}", *(f"{1e3 * r[link]:.1f}" for link in links)]
        + [f"{1e3 * r['compute_sec']:.1f}"]
        for r in project()
    ]
    header = ["T = 8, projected", "busiest device GB per step", *(f"ms at {link}" for link in links)]
    return _markdown(header + [f"compute ms at {MFU:.0%} of {PEAK / 1e12:.0f} TFLOP/s"], body)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes tensor_parallel")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--micro_batch", type=int, default=4, help="sequences per micro-batch (K = 1)")
    parser.add_argument("--shards", type=int, default=4, help="N (--tensor_shards)")
    parser.add_argument("--parallel", default="1,2,4", help="T values (--tensor_parallel), each dividing N")
    parser.add_argument("--time_steps", type=int, default=5, help="steps per timed window; 0: no timing")
    parser.add_argument("--windows", type=int, default=3, help="timed windows (median), after an untimed one")
    parser.add_argument("--per_layer", action="store_true", help="also build at one layer fewer (untimed)")
    parser.add_argument("--devices", type=int, default=4, help="logical CPU devices")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--rows", help="print the tables of rows a --json run wrote, running nothing")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    rows = [] if args.rows else run(args, [a for a in argv if not a.startswith("--json")])
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.rows:
        rows = json.loads(pathlib.Path(args.rows).read_text())
    print(report(_size(args), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
