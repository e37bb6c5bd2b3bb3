"""`python -m benchmarks.machines peers`: towerflow against TensorFlow's own multi-machine strategies. Needs root.

    python -m benchmarks.machines peers sync            # throughput pairs, bytes per step, weights hashes
    python -m benchmarks.machines peers async           # ParameterServerStrategy against --update_mode=async
    python -m benchmarks.machines peers slurm           # the sync pair as 2-node Slurm jobs (node fixture)
    python -m benchmarks.machines peers sync --steps=300 --repeats=3 --out=benchmarks/results/peers-sync.json

Every task runs in its own network namespace (`strategies.cluster.NET`), pinned to its share of the 2 cores as
`benchmarks.machines multinode` pins. The peers' code and each comparison: benchmarks/machines/strategies/
(mwms.py and mwms.sbatch sync, ps.py async; sync.py, asynchronous.py, slurm.py; cluster.py the processes).
Results: benchmarks/results/peers.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from importlib import metadata

from benchmarks.harness import paths
from benchmarks.machines.multinode import _machine, model_bytes
from benchmarks.machines.strategies import cluster as pc

NAMESPACES = 4  # MWMS 4x1 and the PS cluster's four tasks


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def sync(args, root: str) -> dict:
    from benchmarks.machines.strategies import sync as peers_sync  # noqa: PLC0415 (each command loads what it runs)

    out = {}
    if "throughput" in args.parts:
        out["throughput"] = peers_sync.throughput(args.steps, args.repeats, root)
        out["load_after_throughput"] = _load()
    if "wire" in args.parts:
        out["wire"] = peers_sync.wire(args.wire_steps, root, model_bytes("cnn", (8, 8, 1))[0])
    if "hashes" in args.parts:
        out["hashes"] = peers_sync.hashes(args.hash_steps, root)
    return out


def async_(args, root: str) -> dict:
    from benchmarks.machines.strategies import asynchronous as peers_async  # noqa: PLC0415

    return peers_async.compare(args.steps, args.repeats, root)


def slurm(args, root: str) -> dict:
    from benchmarks.machines.strategies import slurm as peers_slurm  # noqa: PLC0415

    return peers_slurm.compare(args.steps, root)


COMMANDS = {"sync": sync, "async": async_, "slurm": slurm}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.machines peers", description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=list(COMMANDS))
    parser.add_argument("--steps", type=int, default=400, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per side")
    parser.add_argument("--wire_steps", type=int, default=20, help="S of the S and 2S byte-counting runs")
    parser.add_argument("--hash_steps", type=int, default=60, help="steps of the weights-hash runs")
    parser.add_argument("--parts", default="throughput,wire,hashes", help="sync: which parts, comma-separated")
    parser.add_argument("--out", default="", help="JSON (default benchmarks/results/peers-WHAT.json)")
    args = parser.parse_args(argv)
    out = args.out or paths.result_path(f"peers-{args.what}.json")
    results = {"machine": _machine(), "tensorflow": metadata.version("tensorflow"), "load_before": _load()}
    results["commit"] = _commit()
    began = time.monotonic()
    if args.what != "slurm":
        pc.NET.up(NAMESPACES)
    try:
        with tempfile.TemporaryDirectory() as root:
            results[args.what] = COMMANDS[args.what](args, root)
    finally:
        if args.what != "slurm":
            pc.NET.down()
    results["load_after"] = _load()
    results["minutes"] = (time.monotonic() - began) / 60
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    print(json.dumps(results, indent=1))


def _commit() -> str:
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=paths.REPO_ROOT)
    return run.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
