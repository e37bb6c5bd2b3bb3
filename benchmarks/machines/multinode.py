"""`python -m benchmarks.machines multinode`: what TensorFlow's gRPC runtime costs, measured on loopback.

    python -m benchmarks.machines multinode                 # cnn on the digits, 1000 steps, both layout pairs, pinned
    python -m benchmarks.machines multinode --repeats=1     # quicker, noisier
    python -m benchmarks.machines multinode --nopin         # every task on every core
    python -m benchmarks.machines multinode --model=mlp     # a model of 0.2 MB: what a step costs beside its bytes
    python -m benchmarks.machines multinode --fusion=off    # M-task layouts unfused only (default both: fused too)

Throughput: `python -m trainer` with M tasks x T logical CPU devices (TF_CONFIG on 127.0.0.1) against 1 task x
M*T devices, same flags, global batch and K; runs alternating; ratio of median examples/sec (the trainer's own
figure: examples over training seconds). Pairs: 2x1 against 1x2, and 2x2 against 1x4.

Pinned (the default): task i of M runs on its own 1/M of the cores (`taskset`), as tasks on separate machines
(or Slurm's `--cpu-bind=cores` on one) run on their own; the one task of the reference gets every core. So
both sides have the same cores and what differs is the gRPC runtime. Unpinned, M processes each size their
thread pools to every core and fight over them, which measures that oversubscription too.

Bytes per step per task: `python -m benchmarks.machines wire` (each task in its own network namespace).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks.harness import paths
from launch.testslurm.ports import free_ports

COMMON = (
    "--device=cpu",
    "--parameter_device=cpu",
    "--log_every_steps=1000",
    "--eval_every_steps=0",
    "--checkpoint_every_steps=0",
    "--histogram_every_steps=0",
    "--export=false",
)


def run(num_tasks: int, towers_per_task: int, flags: list[str], model_dir: str, pin: bool = False) -> dict:
    """Runs one training with `num_tasks` local processes (task i on its own share of the cores when `pin`);
    returns the chief's metrics."""
    workers = [f"127.0.0.1:{p}" for p in free_ports(num_tasks)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    command = [sys.executable, "-m", "trainer", f"--model_dir={model_dir}", f"--num_gpus={towers_per_task}"]
    procs = []
    for i in range(num_tasks):
        if num_tasks > 1:
            tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
            env = dict(env, TF_CONFIG=json.dumps(tf_config))
        cores = ["taskset", "-c", cores_of(i, num_tasks)] if pin else []
        procs.append(subprocess.Popen([*cores, *command, *COMMON, *flags], env=env, stdout=subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    if codes != [0] * num_tasks:
        raise RuntimeError(f"{num_tasks}-task run failed with {codes}")
    with open(os.path.join(model_dir, "metrics.json")) as f:
        return json.load(f)


def cores_of(task: int, num_tasks: int) -> str:
    """Task `task`'s contiguous share of the cores this process may use, as taskset's list ("0", "2-3")."""
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // num_tasks)
    mine = cores[task * share : (task + 1) * share] or cores[-share:]
    return ",".join(str(c) for c in mine)


# name -> (M tasks x T devices, 1 task x M*T devices)
PAIRS = {"2x1": ((2, 1), (1, 2)), "2x2": ((2, 2), (1, 4))}
GLOBAL_BATCH = 128


# --fusion -> the --fuse_transfers values each M-task layout runs with (a 1-task layout has nothing to fuse)
FUSION = {"off": ("false",), "on": ("true",), "both": ("false", "true")}


def throughput(flags: list[str], repeats: int, root: str, pin: bool, pairs=tuple(PAIRS), fusion="off") -> dict:
    """Examples/sec of each layout of the PAIRS named in `pairs` (the M-task one with each of `fusion`'s
    --fuse_transfers, named `MxT-fused` when on), runs alternating, and each M-task run's ratio of medians to
    its 1-task pair and the milliseconds per step it adds; with both, fused against unfused too."""
    chosen = [PAIRS[name] for name in pairs]
    rates: dict[str, list[float]] = {}
    for r in range(repeats):
        for (m, t), (one, k) in chosen:
            runs = [(f"{m}x{t}" + ("-fused" if fuse == "true" else ""), m, t, fuse) for fuse in FUSION[fusion]]
            for name, tasks, towers, fuse in [*runs, (f"{one}x{k}", one, k, "false")]:
                metrics = run(tasks, towers, [*flags, f"--fuse_transfers={fuse}"], f"{root}/tp-{name}-{r}", pin)
                rates.setdefault(name, []).append(metrics["examples_per_sec"])
    medians = {k: statistics.median(v) for k, v in rates.items()}
    ratios, added = {}, {}
    for (m, t), (one, k) in chosen:
        for name in [n for n in medians if n.split("-")[0] == f"{m}x{t}"]:
            ratios[f"{name}_vs_{one}x{k}"] = medians[name] / medians[f"{one}x{k}"]
            added[f"{name}_vs_{one}x{k}"] = 1000 * GLOBAL_BATCH * (1 / medians[name] - 1 / medians[f"{one}x{k}"])
        if fusion == "both":
            ratios[f"{m}x{t}-fused_vs_{m}x{t}"] = medians[f"{m}x{t}-fused"] / medians[f"{m}x{t}"]
    return {"pinned": pin, "examples_per_sec": rates, "median": medians, "ratios": ratios, "added_ms_per_step": added}


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.machines multinode", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000, help="steps per throughput run")
    parser.add_argument("--parameter_device", default="cpu", choices=("cpu", "gpu", "spread"))
    parser.add_argument("--model", default="cnn", choices=("cnn", "mlp"), help="cnn: 0.61 MB of variables; mlp: 0.20")
    parser.add_argument(
        "--pin", action=argparse.BooleanOptionalAction, default=True, help="a share of the cores per task"
    )
    parser.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated layout pairs: {', '.join(PAIRS)}")
    parser.add_argument(
        "--fusion", default="both", choices=tuple(FUSION), help="M-task layouts with --fuse_transfers off, on or both"
    )
    parser.add_argument("--out", default=paths.result_path("multinode.json"))
    args = parser.parse_args(argv)
    pairs = [name for name in args.pairs.split(",") if name]
    if not pairs or set(pairs) - set(PAIRS):
        parser.error(f"--pairs: choose from {', '.join(PAIRS)}")
    results = {"machine": _machine(), "steps": args.steps, "global_batch_size": GLOBAL_BATCH, "model": args.model}
    results["parameter_device"] = args.parameter_device
    with tempfile.TemporaryDirectory() as root:
        flags = [f"--model={args.model}", f"--global_batch_size={GLOBAL_BATCH}", f"--train_steps={args.steps}"]
        flags.append(f"--parameter_device={args.parameter_device}")  # after COMMON's cpu: the last one counts
        results[f"{args.model}_throughput"] = throughput(flags, args.repeats, root, args.pin, pairs, args.fusion)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    print(json.dumps(results[f"{args.model}_throughput"], indent=1))


def _machine() -> str:
    return f"{os.cpu_count()} CPUs, {os.uname().machine}, Python {sys.version.split()[0]}"
