"""Which ratios a run publishes (issue #56): a figure whose two sides did not have the same machine is written as
refused, with its reason, instead of as a ratio.

The rules apply to the figures whose sides measure their matmul peak (the language model's, benchmarks/harness/
mfu.py); docs/benchmarks.md states them. A run published at load 4.5-8 on 2 cores once put PyTorch 2.9-4.3x
behind towerflow, where a quiet machine put it at 0.95 (benchmarks/results/lm-peers.md): PyTorch's two threads
wait for each other at every op, so the other jobs slowed it far more than TensorFlow. Such a ratio measures
the load, not the code.

- starved: the two sides' matmul peaks (the median of the repeats, per thread of the side's framework) differ by
  more than their noise, the larger of the two sides' relative IQRs of the repeats, and never under
  PEAK_NOISE_FLOOR (the IQR of a few repeats on a quiet machine can be ~0, and two frameworks' kernels for the
  same product are not equally fast).
- loaded: the 1-minute load average at a window's start exceeded the CPU count by more than LOAD_ALLOWANCE: the
  run's own thread pools alone hold the average a little above the CPU count (2.2 and 2.5 at the end of runs
  that started at 0.07 and 1.2 on 2 cores: benchmarks/results/runtime.json, full.json).
"""

from __future__ import annotations

import statistics

PEAK_NOISE_FLOOR = 0.10  # the load era's peaks differed by 40-60% between the sides (lm-peers.md)
LOAD_ALLOWANCE = 1.0  # load average allowed above the CPU count: the run's own threads


def _peak(side: dict) -> tuple[float, float, float]:
    """(median FLOP/s, median per thread, relative IQR) of a side's matmul repeats (0 for fewer than two)."""
    rates = side["matmul_rates"]
    median = statistics.median(rates)
    spread = 0.0
    if len(rates) > 1:
        q25, _, q75 = statistics.quantiles(rates, n=4, method="inclusive")
        spread = (q75 - q25) / median
    return median, median / side["matmul_threads"], spread


def _name(side: dict) -> str:
    return side["label"].split()[0]  # "towerflow", "nanogpt_torch", "keras_hub_fit", ...


def starved(record: dict) -> str:
    """The reason the sides' matmul peaks refuse the figure, or ""."""
    (a_flops, a_per_thread, a_spread), (b_flops, b_per_thread, b_spread) = _peak(record["a"]), _peak(record["b"])
    noise = max(a_spread, b_spread, PEAK_NOISE_FLOOR)
    if abs(a_per_thread - b_per_thread) <= noise * max(a_per_thread, b_per_thread):
        return ""
    low, high = ("a", "b") if a_per_thread < b_per_thread else ("b", "a")
    flops = {"a": a_flops, "b": b_flops}
    low_side, high_side = record[low], record[high]
    return (
        f"starved: {_name(low_side)} side's matmul peak {flops[low] / 1e9:.1f} GFLOP/s on "
        f"{low_side['matmul_threads']} thread(s) vs {_name(high_side)}'s {flops[high] / 1e9:.1f} on "
        f"{high_side['matmul_threads']} (noise {noise:.0%})"
    )


def loaded(record: dict) -> str:
    """The reason the load average at the windows' starts refuses the figure, or ""."""
    windows = record["a"]["load"] + record["b"]["load"]
    over = [w for w in windows if w["load_average_start"] > w["cpus_start"] + LOAD_ALLOWANCE]
    if not over:
        return ""
    worst = max(over, key=lambda w: w["load_average_start"])
    return (
        f"loaded: 1-minute load average {worst['load_average_start']:.2f} at a window's start, above "
        f"{worst['cpus_start']} CPUs + {LOAD_ALLOWANCE:g} ({len(over)} of {len(windows)} windows)"
    )


def judge(record: dict) -> dict:
    """`record` (runner.result, with its sides' stats and loads), or, when a rule refuses it, the same record
    with status "refused", its `refused` reason and no ratio, pass or pair ratios (the windows' rates stay)."""
    if record["status"] != "ok" or not all("matmul_rates" in record[label] for label in ("a", "b")):
        return record
    reason = "; ".join(filter(None, (loaded(record), starved(record))))
    if not reason:
        return record
    unpublished = ("ratio", "passed", "pair_ratios", "pair_ratio_iqr")
    return {**{k: v for k, v in record.items() if k not in unpublished}, "status": "refused", "refused": reason,
            "ratio": None, "passed": None}  # fmt: skip
