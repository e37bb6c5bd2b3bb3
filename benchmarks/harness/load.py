"""The machine's load beside each timed window: what else ran while a figure was measured (issue #56).

Read from /proc (Linux, as the rest of the harness), in the parent around each timed window's command: the
1-minute load average and the CPU count (`loadavg`; the `cpuN` lines of `stat`) at the window's start and end,
and the CPUs the other processes used during the window, `other_cpus`: the machine's busy jiffies (`stat`: user,
nice, system, irq, softirq, steal) less this run's own (utime, stime and waited-for children's cutime, cstime of
the parent and of every worker, from `<pid>/stat`), as a fraction of all the CPUs' jiffies, times the CPU count.
Jiffies are 1/100 s: over a window shorter than a second `other_cpus` is coarse. None when a process of the run
could not be read (a worker exited during the window). A few small reads: microseconds per window.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

from benchmarks.harness import timing

PROC = "/proc"  # read at each call: tests point it at files of their own
_BUSY = (0, 1, 2, 5, 6, 7)  # of user nice system idle iowait irq softirq steal (guest time is inside user)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    load_average: float  # 1 minute
    cpus: int
    busy_jiffies: int
    total_jiffies: int
    own_jiffies: int | None  # None: a process of the run could not be read


def own_jiffies(pids: list[int]) -> int | None:
    """CPU jiffies the processes `pids` used (their threads, and their children they waited for)."""
    total = 0
    for pid in pids:
        try:
            with open(f"{PROC}/{pid}/stat") as f:
                text = f.read()
        except OSError:
            return None
        fields = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        total += sum(int(value) for value in fields[11:15])  # fields 14-17: utime stime cutime cstime
    return total


def snapshot(pids: list[int]) -> Snapshot:
    """The load average, the CPU count and the busy, total and own (`pids`) jiffies now."""
    with open(f"{PROC}/loadavg") as f:
        load_average = float(f.read().split()[0])
    with open(f"{PROC}/stat") as f:
        lines = f.read().splitlines()
    jiffies = [int(value) for value in lines[0].split()[1:9]]
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    busy = sum(jiffies[i] for i in _BUSY)
    return Snapshot(load_average, cpus, busy, sum(jiffies), own_jiffies(pids))


def window_load(start: Snapshot, end: Snapshot) -> dict:
    """What a window's JSON record says of the machine between `start` and `end`."""
    elapsed = end.total_jiffies - start.total_jiffies
    other = None
    if start.own_jiffies is not None and end.own_jiffies is not None and elapsed > 0:
        busy = end.busy_jiffies - start.busy_jiffies - (end.own_jiffies - start.own_jiffies)
        other = round(max(0, busy) / elapsed * end.cpus, 3)  # jiffies are sampled: never below zero
    return {
        "load_average_start": start.load_average,
        "load_average_end": end.load_average,
        "cpus_start": start.cpus,
        "cpus_end": end.cpus,
        "other_cpus": other,
    }


def watched(window: timing.Window, loads: list[dict], pids: Callable[[], list[int]]) -> timing.Window:
    """`window`, appending each run's `window_load` to `loads`; `pids()`: the run's processes now."""

    def run(steps: int) -> tuple[float, int]:
        start = snapshot(pids())
        result = window(steps)
        loads.append(window_load(start, snapshot(pids())))
        return result

    return run


def summary(loads: list[dict]) -> dict:
    """A figure's load at a glance: the highest load average at a window's start, the fewest CPUs, and the
    median of the other processes' CPUs over the windows that have one."""
    others = [w["other_cpus"] for w in loads if w["other_cpus"] is not None]
    return {
        "load_average_start_max": max(w["load_average_start"] for w in loads),
        "cpus": min(w["cpus_start"] for w in loads),
        "other_cpus_median": statistics.median(others) if others else None,
    }
