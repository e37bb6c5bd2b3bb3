"""What a run prints and writes: the machine, the versions, and one row per figure."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess

from benchmarks.harness import paths


def _first_line_with(path: str, prefix: str) -> str:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=paths.REPO_ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def environment(worker_info: dict, started: str, load_average_start: list[float]) -> dict:
    """Machine, versions and load: enough to tell whether two result files are comparable."""
    return {
        "date": started,
        "date_end": now(),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": _first_line_with("/proc/cpuinfo", "model name"),
        "memory": _first_line_with("/proc/meminfo", "MemTotal"),
        "python": platform.python_version(),
        "tensorflow": worker_info.get("tensorflow", "unknown"),
        "keras": worker_info.get("keras", "unknown"),
        "git_commit": _git("rev-parse", "HEAD"),
        # The trainer may be edited while benchmarks run; a dirty tree means the commit is not the whole story.
        "git_dirty_paths": _git("status", "--porcelain").splitlines(),
        "load_average_start": load_average_start,
        "load_average_end": list(os.getloadavg()),
    }


def _number(value: float) -> str:
    return f"{value:,.0f}"


_COLUMNS = (
    ("figure", 28),
    ("setting", 14),
    ("ratio", 6),
    ("target", 8),
    ("result", 13),
    ("towerflow ex/s", 14),
    ("reference ex/s", 14),
    ("windows", 9),
    ("pair IQR", 11),
    ("load/CPUs", 9),
)


def header() -> str:
    return "  ".join(f"{name:<{width}}" for name, width in _COLUMNS)


def _load(record: dict) -> str:
    """The highest 1-minute load average at a window's start, over the CPU count (load.summary)."""
    if "load" not in record:
        return ""
    return f"{record['load']['load_average_start_max']:.1f}/{record['load']['cpus']}"


def row(record: dict) -> str:
    """One line of the table for one figure record (see `runner.result`; a refused one, `trust.judge`)."""
    target = f">= {record['target']:.2f}" if record["target"] is not None else "-"
    if record["status"] not in ("ok", "refused"):
        cells = [record["name"], record["setting"], "-", target, record["status"], "", "", "", "", ""]
    else:
        verdict = "-" if record["passed"] is None else ("PASS" if record["passed"] else "MISS")
        ratio, spread = "-", ""
        if record["status"] == "refused":
            verdict = "REFUSED"
        else:
            q25, q75 = record["pair_ratio_iqr"]
            ratio, spread = f"{record['ratio']:.3f}", f"{q25:.2f}-{q75:.2f}"
        cells = [
            record["name"],
            record["setting"],
            ratio,
            target,
            verdict,
            _number(record["a"]["median_examples_per_sec"]),
            _number(record["b"]["median_examples_per_sec"]),
            f"{record['windows']}x{record['steps_per_window']}",
            spread,
            _load(record),
        ]
    return "  ".join(f"{cell:<{width}}" for cell, (_, width) in zip(cells, _COLUMNS, strict=True))


def refusals(records: list[dict]) -> list[str]:
    """One line per refused figure, with its reason (benchmarks/harness/trust.py)."""
    return [f"refused {r['name']}: {r['refused']}" for r in records if r["status"] == "refused"]


def legend(records: list[dict]) -> list[str]:
    """What each figure compares (A / B) and its setting; errors with their last line."""
    lines = []
    for record in records:
        line = f"{record['name']} [{record['setting_text']}]: A = {record['a']['label']}; B = {record['b']['label']}"
        for label in ("a", "b"):
            side = record[label]
            if "staleness_mean" in side:
                mean, most = side["staleness_mean"], side["staleness_max"]
                line += f"\n    {label.upper()}: staleness mean {mean:.2f}, max {most}"
            if "mfu" in side:  # a language model's side (mfu.annotate)
                line += f"\n    {label.upper()}: {side['tokens_per_sec']:,.0f} tokens/s, MFU {side['mfu']:.1%}"
                line += f" ({side['parameters']:,} parameters, {side['peak_framework']} matmul peak"
                line += f" {side['matmul_peak_flops'] / 1e9:.1f} GFLOP/s)"
        if "load" in record:
            summary, other = record["load"], record["load"]["other_cpus_median"]
            line += f"\n    load average up to {summary['load_average_start_max']:.2f} at a window's start on"
            line += f" {summary['cpus']} CPUs; other processes {'?' if other is None else f'{other:.2f}'} CPUs"
            line += " (median of the windows)"
        if record["status"] == "error":
            line += f"\n    error: {record['error'].strip().splitlines()[-1]}"
        lines.append(line)
    return lines


def write_json(path: str, run: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as f:
        json.dump(run, f, indent=1)
        f.write("\n")
