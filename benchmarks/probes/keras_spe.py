"""`python -m benchmarks.probes keras_spe [--settings=..] [--values=8,32,128] [--devices=1,2,4]`: tunes the Keras `fit`
reference as a user would, by trying `steps_per_execution` values.

Each value S is timed against S = 1 on the same devices, alternating windows as every figure is (`--quick`
windows), so the ratio is robust to load; the fastest S is what `benchmarks.figures.KERAS_STEPS_PER_EXECUTION`
should hold. Keras 3.15 has no `steps_per_execution="auto"` (tf.keras 2.x's), so only integers are tried.
Then, at the tuned S, the reference without its accuracy metric against with it (what that metric costs).
"""

from __future__ import annotations

import argparse
import os
import tempfile

from benchmarks.figures import KERAS_STEPS_PER_EXECUTION
from benchmarks.harness import records as records_lib
from benchmarks.harness import runner
from benchmarks.harness.plan import SETTINGS, SIZES, Figure, Side
from benchmarks.harness.session import Sessions


def spe_figures(settings: list[str], values: list[int], devices: list[int]) -> list[Figure]:
    """`keras_fit{N}_spe{S}_vs_spe1` on each setting and device count, then what the accuracy metric costs at
    the tuned S (`keras_fit{N}_loss_only_vs_accuracy`)."""
    spe = [
        Figure(
            f"keras_fit{n}_spe{s}_vs_spe1",
            SETTINGS[name],
            Side("keras_fit", n, steps_per_execution=s),
            Side("keras_fit", n, steps_per_execution=1),
        )
        for name in settings
        for n in devices
        for s in values
    ]
    tuned = KERAS_STEPS_PER_EXECUTION
    accuracy = [
        Figure(
            f"keras_fit{n}_loss_only_vs_accuracy",
            SETTINGS[name],
            Side("keras_fit", n, steps_per_execution=tuned[name], keras_accuracy=False),
            Side("keras_fit", n, steps_per_execution=tuned[name]),
        )
        for name in settings
        for n in devices
    ]
    return spe + accuracy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes keras_spe", description=__doc__.split("\n")[0])
    parser.add_argument("--settings", default="cnn-digits,resnet20-synth")
    parser.add_argument("--values", default="8,32,128", help="steps_per_execution values timed against 1")
    parser.add_argument("--devices", default="1,2,4", help="1: no strategy; more: MirroredStrategy")
    parser.add_argument("--size", default="quick", choices=sorted(SIZES), help="windows per side")
    args = parser.parse_args(argv)
    as_ints = lambda text: [int(v) for v in text.split(",")]  # noqa: E731
    figures = spe_figures(args.settings.split(","), as_ints(args.values), as_ints(args.devices))
    size = SIZES[args.size]
    print(f"load average at start {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="towerflow-bench-logs-") as log_dir:
        sessions = Sessions(log_dir)
        try:
            records = {s.name: records_lib.ensure_records(s) for s in {f.setting for f in figures}}
            for record in runner.run(figures, size, records, sessions, available=set()):
                if record["status"] != "ok":
                    print(f"{record['setting']:15s} {record['name']:28s} {record['status']}: {record['error']}")
                    continue
                a, b = record["a"], record["b"]
                print(
                    f"{record['setting']:15s} {record['name']:33s} A {a['median_examples_per_sec']:9,.0f} ex/s  "
                    f"B {b['median_examples_per_sec']:9,.0f} ex/s  ratio A/B {record['ratio']:.3f}  "
                    f"IQR {record['pair_ratio_iqr'][0]:.2f}-{record['pair_ratio_iqr'][1]:.2f}",
                    flush=True,
                )
        finally:
            sessions.close()
    print(f"load average at end {os.getloadavg()[0]:.2f}")
