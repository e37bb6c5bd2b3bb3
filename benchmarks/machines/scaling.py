"""`python -m benchmarks.machines scaling`: the paper model of M nodes x 8 GPUs for ResNet-50, from the measured bytes.

Not a measurement: no GPU and no real network were available. It projects the speed of a sync step from
what was measured on this machine (the bytes each task moves per step, `benchmarks/results/wire.json`) and
published figures, with every assumption a named constant below:

    step(M)     = t + w + g x (1 - overlap)           (t: one GPU's compute on its micro-batch)
    w = g       = the busiest node's bytes of one phase / link bandwidth (`phase_bytes`)
    speed-up    = M x G x t / step(M) x single-node efficiency
    efficiency  = speed-up / (M x G)

A sync step has two transfer phases on its critical path: the variables a node does not own must arrive
before its towers start (w), and its partial gradient sums must reach the owners before the update (g). The
link is full duplex: a node's sends and receives of one phase overlap. `overlap` is the share
of g hidden behind the backward pass (a subtree's sum is sent as soon as it exists); 0 is the worst case.
"""

from __future__ import annotations

import argparse
import json
import os

from benchmarks.harness import paths

PARAMETERS = 25_557_032  # ResNet-50, 1000 classes (Keras applications), float32
VARIABLE_BYTES = PARAMETERS * 4
GPUS_PER_NODE = 8
# tf_cnn_benchmarks' published ResNet-50 scaling on one 8-GPU machine: 7.9x of one GPU
SINGLE_NODE_EFFICIENCY = 7.9 / 8
LINKS_GBITS = (100, 25)
COMPUTE_SEC = (0.1, 0.2, 0.4)
NODES = (2, 4, 8)
RESULTS = paths.result_path("wire.json")


def phase_bytes(nodes: int, placement: str) -> float:
    """Bytes of one transfer phase through the busiest node's link, as a multiple of the variable bytes.

    spread: a node owns 1/M of the bytes; in the variables phase it sends its share to M-1 nodes and
    receives the other (M-1)/M, at once (full duplex): (M-1)/M; the gradient phase mirrors it. Per
    direction per step that is 2(M-1)/M, the bound of a ring all-reduce.
    cpu/gpu (variables on the chief): the chief sends all of them to M-1 nodes, then receives M-1 partial
    sums: M-1 per phase, one direction each; per direction per step also M-1.
    """
    return (nodes - 1) / nodes if placement == "spread" else nodes - 1


def project(nodes: int, compute_sec: float, link_gbits: float, placement: str, excess: float, overlap: float) -> dict:
    """One row of the model; `excess` scales the bytes by the measured ratio to the bound."""
    phase = phase_bytes(nodes, placement) * excess * VARIABLE_BYTES
    phase_sec = phase / (link_gbits * 1e9 / 8)
    step = compute_sec + phase_sec + phase_sec * (1 - overlap)
    speedup = nodes * GPUS_PER_NODE * compute_sec / step * SINGLE_NODE_EFFICIENCY
    per_direction = 2 * phase if placement == "spread" else phase
    return {
        "nodes": nodes,
        "gpus": nodes * GPUS_PER_NODE,
        "compute_sec": compute_sec,
        "link_gbits": link_gbits,
        "placement": placement,
        "mb_per_direction": per_direction / 1e6,
        "transfer_ms": 1e3 * (step - compute_sec),
        "speedup": speedup,
        "efficiency": speedup / (nodes * GPUS_PER_NODE),
    }


def measured_excess(path: str = RESULTS, model: str = "resnet50") -> float:
    """The largest ratio, over the `spread` cells of `model` in `benchmarks.machines.wire`'s results and over
    their tasks and directions, of the bytes a task moved per step to the bound 2(M-1)/M x the variable bytes
    (1.0 when there are none)."""
    if not os.path.exists(path):
        return 1.0
    with open(path) as f:
        cells = json.load(f).get("cells", [])
    ratios = [
        max(t["received_per_variable_byte"], t["sent_per_variable_byte"]) / c["ring_bound"]
        for c in cells
        if c["parameter_device"] == "spread" and c["model"] == model
        for t in c["per_task"]
    ]
    return max(ratios, default=1.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.machines scaling", description=__doc__.split("\n")[0])
    parser.add_argument("--overlap", type=float, default=0.0, help="share of the gradient phase hidden")
    args = parser.parse_args(argv)
    excess = measured_excess()
    print(f"ResNet-50, {VARIABLE_BYTES / 1e6:.1f} MB of variables; measured excess over the bound {excess:.3f}")
    print("| nodes x GPUs | link | placement | MB per direction | t | transfer | speed-up | efficiency |")
    print("|---|---|---|---|---|---|---|---|")
    for nodes in NODES:
        for link in LINKS_GBITS:
            for placement in ("spread", "cpu"):
                for t in COMPUTE_SEC:
                    r = project(nodes, t, link, placement, excess, args.overlap)
                    print(
                        f"| {nodes} x {GPUS_PER_NODE} | {link} Gb/s | {placement} | {r['mb_per_direction']:.0f} | "
                        f"{t} s | {r['transfer_ms']:.1f} ms | {r['speedup']:.1f}x | {r['efficiency']:.1%} |"
                    )
