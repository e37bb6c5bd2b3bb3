"""Alternating timed windows and the statistics of a figure.

The machine is shared and noisy (2 cores, other jobs come and go). Timing side A for a minute and then side
B for a minute would fold any change in load into the ratio. Alternating windows (A, B, A, B, ...) exposes
both sides to the same load, and the median of each side's windows ignores the odd window a burst of other
work slowed down.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable

# A window: runs `steps` steps and returns (seconds, examples) it took and trained.
Window = Callable[[int], tuple[float, int]]


@dataclasses.dataclass
class Comparison:
    """Examples/sec of every timed window of both sides, in the order they ran."""

    a_rates: list[float] = dataclasses.field(default_factory=list)
    b_rates: list[float] = dataclasses.field(default_factory=list)

    @property
    def median_a(self) -> float:
        return statistics.median(self.a_rates)

    @property
    def median_b(self) -> float:
        return statistics.median(self.b_rates)

    @property
    def ratio(self) -> float:
        """The figure: median(a) / median(b)."""
        return self.median_a / self.median_b

    @property
    def pair_ratios(self) -> list[float]:
        """a/b of each adjacent pair of windows: their spread says how far to trust `ratio`."""
        return [a / b for a, b in zip(self.a_rates, self.b_rates, strict=True)]

    def pair_ratio_quartiles(self) -> tuple[float, float]:
        """(25th, 75th) percentile of the pair ratios; both equal with fewer than two pairs."""
        ratios = self.pair_ratios
        if len(ratios) < 2:
            return (ratios[0], ratios[0]) if ratios else (math.nan, math.nan)
        quartiles = statistics.quantiles(ratios, n=4, method="inclusive")
        return quartiles[0], quartiles[2]


def rate(window: Window, steps: int) -> float:
    """Runs one window and returns its examples/sec."""
    seconds, examples = window(steps)
    return examples / seconds


def alternate(window_a: Window, window_b: Window, steps: int, windows: int) -> Comparison:
    """Times `windows` windows of `steps` steps per side, A then B, A then B, ..."""
    result = Comparison()
    for _ in range(windows):
        result.a_rates.append(rate(window_a, steps))
        result.b_rates.append(rate(window_b, steps))
    return result


def calibrate(seconds_per_step: float, window_sec: float, min_steps: int, max_steps: int = 2000) -> int:
    """Steps per window so the slower side's window lasts about `window_sec` (at least `min_steps`).

    Long enough that the per-window costs (fetching metrics, the last step's timing) stay small; short
    enough that many windows fit in the budget, so the median has something to choose from.
    """
    if window_sec <= 0 or seconds_per_step <= 0:
        return min_steps
    return max(min_steps, min(max_steps, round(window_sec / seconds_per_step)))
