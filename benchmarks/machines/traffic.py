"""`python -m benchmarks.machines traffic`: bytes through the busiest device per sync step, per parameter placement.

    python -m benchmarks.machines traffic                          # cnn, resnet20, resnet50 at N = 2, 4, 8 (K = N)
    python -m benchmarks.machines traffic --models=cnn --towers=2,4

Counted from the traced step (`trainer.step.transfers.traffic.count`), not timed: the figure is what a layout
asks of the busiest device, the same on any machine. N towers are logical CPU devices 0..N-1 standing in for GPUs and
one more logical device, N, stands for the host, so `cpu` (variables on the host) and `gpu` (variables on
the first tower) differ as they would on a GPU machine. A process configures its logical devices once, so
each N runs in its own subprocess. Ideal = 2(N-1)/N x model bytes (all model variables, BatchNorm statistics
included): what a balanced layout sends and receives through each device.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PLACEMENTS = ("gpu", "cpu", "spread")
# Small inputs: the variables (what moves) barely depend on the image size; the input batch is 2 examples
# per micro-batch, so the host's share stays small next to the model.
EXAMPLE_SHAPES = {"cnn": (8, 8, 1), "mlp": (64,), "resnet20": (32, 32, 3), "resnet50": (32, 32, 3)}
NUM_CLASSES = 10


def measure(model: str, num_towers: int, placement_name: str, per_micro_batch: int = 2, time_steps: int = 0) -> dict:
    """Builds the trainer's model, optimizer and sync step for one placement and counts its traffic; with
    `time_steps`, also times windows of that many steps (median examples/sec of 3, after one warm-up)."""
    from trainer.step.transfers import traffic

    step, variables, host = _sync_step(model, num_towers, placement_name, per_micro_batch)
    graph = step.step_graph()
    counted = traffic.count(graph, host)
    device, busiest = counted.busiest()
    row = {
        "model": model,
        "towers": num_towers,
        "placement": placement_name,
        "model_bytes": traffic.model_bytes(variables),
        "ideal_bytes": traffic.ideal_bytes(variables, num_towers),
        "busiest_device": device,
        "busiest_bytes": busiest,
        "unknown_edges": counted.unknown_edges,
    }
    if time_steps:
        row["examples_per_sec"] = _examples_per_sec(step, time_steps)
    return row


def _sync_step(model: str, num_towers: int, placement_name: str, per_micro_batch: int):
    """The trainer's sync step (K = N) over an in-memory batch of zeros; returns it, the model's variables
    and the host device."""
    import tensorflow as tf

    from tasks.classify import Classify
    from trainer.loop.build import build_model_and_optimizer
    from trainer.settings import config as cfg
    from trainer.step.sync.sync_update import SyncUpdate

    placement = _placement(num_towers, placement_name)
    config = cfg.RunConfig(
        towers=cfg.TowerConfig(
            num_towers=num_towers,
            device="cpu",
            parameter_device=placement_name,
            global_batch_size=num_towers * per_micro_batch,  # K = N micro-batches of per_micro_batch
        ),
        model=cfg.ModelConfig(model),
    )
    task = Classify(config)
    task.bind(EXAMPLE_SHAPES[model], NUM_CLASSES)
    model_, optimizer, global_step = build_model_and_optimizer(config, placement, task)
    from trainer.loop.inputs import PlacedIterator

    dataset = tf.data.Dataset.from_tensors(
        (tf.zeros((per_micro_batch, *EXAMPLE_SHAPES[model])), tf.zeros((per_micro_batch,), tf.int32))
    ).repeat()
    iterators = [PlacedIterator(dataset, placement.host) for _ in range(num_towers)]  # one stream per micro-batch
    step = SyncUpdate(task, model_, optimizer, placement, num_towers, global_step, iterators)
    return step, model_.variables, placement.host


def _examples_per_sec(step, steps: int) -> float:
    rates = []
    for window in range(4):
        start = time.perf_counter()
        step.train_steps(steps)  # returns once the window's last step has run (its loss read on the host)
        if window:  # the first window traces and warms up
            rates.append(steps * step.examples_per_step / (time.perf_counter() - start))
    return statistics.median(rates)


def _placement(num_towers: int, name: str):
    from trainer.system.devices import Placement

    towers = tuple(f"/device:CPU:{i}" for i in range(num_towers))
    host = f"/device:CPU:{num_towers}"
    parameter_device = host if name == "cpu" else towers[0]
    return Placement(towers, parameter_device, host, towers if name == "spread" else ())


def _worker(num_towers: int, model_names: list[str], per_micro_batch: int, time_steps: int) -> None:
    """Prints one JSON line per (model, placement) at `num_towers` towers."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * (num_towers + 1))
    for model in model_names:
        for placement in PLACEMENTS:
            row = measure(model, num_towers, placement, per_micro_batch, time_steps)
            print(json.dumps(row), flush=True)


def run(model_names: list[str], tower_counts: list[int], worker_args: list[str]) -> list[dict]:
    """Measures every (model, N, placement), each N in its own subprocess."""
    rows = []
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for num_towers in tower_counts:
        command = [sys.executable, "-m", "benchmarks.machines", "traffic", f"--worker={num_towers}", *worker_args]
        out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
        rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows


def table(rows: list[dict]) -> str:
    """A markdown table: the busiest device's bytes per step, their ratio to the ideal and, when timed,
    examples/sec relative to `gpu` at the same model and N."""
    timed = "examples_per_sec" in rows[0]
    lines = [
        "| model | N = K | model MB | ideal MB | placement | busiest device | busiest MB | / ideal |"
        + (" ex/s | / gpu ex/s |" if timed else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|---|" if timed else ""),
    ]
    gpu_rate = {(r["model"], r["towers"]): r.get("examples_per_sec") for r in rows if r["placement"] == "gpu"}
    for r in rows:
        mb = 1e6
        line = (
            f"| {r['model']} | {r['towers']} | {r['model_bytes'] / mb:.2f} | {r['ideal_bytes'] / mb:.2f} "
            f"| {r['placement']} | {r['busiest_device']} | {r['busiest_bytes'] / mb:.2f} "
            f"| {r['busiest_bytes'] / r['ideal_bytes']:.2f} |"
        )
        if timed:
            rate = r["examples_per_sec"]
            line += f" {rate:,.0f} | {rate / gpu_rate[r['model'], r['towers']]:.3f} |"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.machines traffic", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="cnn,resnet20,resnet50", help="comma-separated built-in models")
    parser.add_argument("--towers", default="2,4,8", help="comma-separated tower counts N (K = N)")
    parser.add_argument("--examples_per_micro_batch", type=int, default=2, help="input examples per micro-batch")
    parser.add_argument("--time_steps", type=int, default=0, help="also time windows of this many steps")
    parser.add_argument("--out", help="also write the rows as JSON to this file")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    model_names = [m for m in args.models.split(",") if m]
    if args.worker:
        _worker(args.worker, model_names, args.examples_per_micro_batch, args.time_steps)
        return 0
    worker_args = [
        f"--models={args.models}",
        f"--examples_per_micro_batch={args.examples_per_micro_batch}",
        f"--time_steps={args.time_steps}",
    ]
    rows = run(model_names, [int(n) for n in args.towers.split(",")], worker_args)
    print(table(rows))
    if any(r["unknown_edges"] for r in rows):
        print("note: some edges had no static shape and were not counted")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
