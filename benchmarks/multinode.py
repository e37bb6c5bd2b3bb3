"""`python -m benchmarks.multinode`: what TensorFlow's gRPC runtime costs, measured on loopback.

    python -m benchmarks.multinode                 # cnn on digits, resnet50 bytes on 32x32x3 synthetic
    python -m benchmarks.multinode --repeats=1     # quicker, noisier

1. Throughput: `python -m trainer` with 2 tasks x 1 logical CPU device (TF_CONFIG on 127.0.0.1) against 1 task
   x 2 logical devices, same flags and global batch, runs alternating; ratio of median examples/sec (the
   trainer's own figure: examples over training seconds).
2. Bytes per step between the tasks: the loopback interface's byte counter (/proc/net/dev, `lo`) over two
   2-task runs of S and 2S steps; their difference over S steps leaves out start-up, checkpoints and eval.
   Both directions are counted (variables to the worker's tower, its gradients and state back).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

COMMON = (
    "--device=cpu",
    "--parameter_device=cpu",
    "--log_every_steps=1000",
    "--eval_every_steps=0",
    "--checkpoint_every_steps=0",
    "--histogram_every_steps=0",
    "--export=false",
)


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def loopback_bytes() -> int:
    """Bytes received on `lo` so far (every loopback byte is sent and received once)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[0])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def run(num_tasks: int, towers_per_task: int, flags: list[str], model_dir: str) -> dict:
    """Runs one training with `num_tasks` local processes; returns the chief's metrics and the loopback bytes."""
    workers = [f"127.0.0.1:{p}" for p in free_ports(num_tasks)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    command = [sys.executable, "-m", "trainer", f"--model_dir={model_dir}", f"--num_gpus={towers_per_task}"]
    before = loopback_bytes()
    procs = []
    for i in range(num_tasks):
        if num_tasks > 1:
            tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
            env = dict(env, TF_CONFIG=json.dumps(tf_config))
        procs.append(subprocess.Popen([*command, *COMMON, *flags], env=env, stdout=subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    if codes != [0] * num_tasks:
        raise RuntimeError(f"{num_tasks}-task run failed with {codes}")
    with open(os.path.join(model_dir, "metrics.json")) as f:
        return {**json.load(f), "loopback_bytes": loopback_bytes() - before}


def throughput(flags: list[str], repeats: int, root: str) -> dict:
    rates = {"1x2": [], "2x1": []}
    for r in range(repeats):
        for layout, (tasks, towers) in (("1x2", (1, 2)), ("2x1", (2, 1))):
            rates[layout].append(run(tasks, towers, flags, f"{root}/tp-{layout}-{r}")["examples_per_sec"])
    medians = {k: statistics.median(v) for k, v in rates.items()}
    return {"examples_per_sec": rates, "median": medians, "ratio_2x1_vs_1x2": medians["2x1"] / medians["1x2"]}


def bytes_per_step(flags: list[str], steps: int, root: str) -> dict:
    short = run(2, 1, [*flags, f"--train_steps={steps}"], f"{root}/bytes-{steps}")
    long = run(2, 1, [*flags, f"--train_steps={2 * steps}"], f"{root}/bytes-{2 * steps}")
    return {"steps": steps, "bytes_per_step": (long["loopback_bytes"] - short["loopback_bytes"]) / steps}


def model_bytes(model: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """(trainable, all) variable bytes of the trainer's model (float32)."""
    code = (
        "import json, models, numpy as np\n"
        f"m = models.build_model({model!r}, {shape!r}, 10)\n"
        "size = lambda vs: sum(int(np.prod(v.shape)) * 4 for v in vs)\n"
        "print(json.dumps([size(m.trainable_variables), size(m.variables)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return tuple(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.multinode", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="cnn steps per throughput run")
    args = parser.parse_args()
    from benchmarks.plan import Setting  # noqa: PLC0415
    from benchmarks.records import ensure_records  # noqa: PLC0415

    results = {"machine": _machine()}
    with tempfile.TemporaryDirectory() as root:
        cnn = ["--model=cnn", "--global_batch_size=128", f"--train_steps={args.steps}"]
        results["cnn_throughput"] = throughput(cnn, args.repeats, root)
        results["cnn_bytes"] = bytes_per_step(["--model=cnn", "--global_batch_size=128"], 100, root)
        results["cnn_model_bytes"] = model_bytes("cnn", (8, 8, 1))
        records = ensure_records(Setting("bytes-resnet50", "resnet50", (32, 32, 3), 10, 4, "synthetic", 512))
        data_flags = [f"--train_data={records['train']}", f"--eval_data={records['eval']}", "--num_classes=10"]
        r50 = ["--model=resnet50", "--global_batch_size=4", *data_flags]
        results["resnet50_bytes"] = bytes_per_step(r50, 5, root)
        results["resnet50_model_bytes"] = model_bytes("resnet50", (32, 32, 3))
    print(json.dumps(results, indent=1))


def _machine() -> str:
    return f"{os.cpu_count()} CPUs, {os.uname().machine}, Python {sys.version.split()[0]}"


if __name__ == "__main__":
    main()
