"""Probes whose checks may crash their process: each check runs in its own process, which prints its result
rows as one `RESULT <json>` line; a process that dies becomes a row naming its signal or exit code and the last
line of its stderr; the rows print as one Markdown table (`python -m benchmarks.probes dtensor`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import numpy as np

from benchmarks.harness import paths


def row(check: str, what: str, result: str, detail: str = "") -> dict:
    """One line of the table: `result` is ok, failed, equal or differs."""
    return {"check": check, "what": what, "result": result, "detail": detail}


def failure(error: BaseException) -> str:
    """`Type: first line` of an exception; for a tf.function's "in user code:" message, the line that names the
    error (its last line) instead of the first."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [""]
    line = lines[-1] if lines[0] == "in user code:" else lines[0]
    kind = type(error).__name__
    return f"{line[:240]}" if line.startswith(f"{kind}: ") else f"{kind}: {line[:240]}"


def attempt(check: str, what: str, fn) -> tuple[dict, object]:
    """(row, value) of `fn()`: ok with `detail(value)` when it returns, failed with the exception when it
    raises (the value is then None). `fn` returns (value, detail)."""
    try:
        value, detail = fn()
    except Exception as error:  # noqa: BLE001 - the probe records whatever TensorFlow raises
        return row(check, what, "failed", failure(error)), None
    return row(check, what, "ok", detail), value


def compare(check: str, quantity: str, got: np.ndarray, want: np.ndarray) -> dict:
    """A bits row: equal when `got` and `want` have the same shape and bits (np.array_equal), with the max abs
    difference either way."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return row(check, f"bits {quantity}", "differs", f"shape {got.shape} != {want.shape}")
    equal = np.array_equal(got, want)
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if got.size else 0.0
    return row(check, f"bits {quantity}", "equal" if equal else "differs", f"max abs diff {diff:.3g}")


def died(check: str, returncode: int, stderr: str) -> dict:
    """The row of a check whose process ended without a result: its signal (a C++ CHECK failure is SIGABRT, a
    segfault SIGSEGV) or exit code, and the last line of its stderr."""
    how = f"killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exit code {returncode}"
    lines = [line for line in stderr.splitlines() if line.strip()]
    return row(check, "process", "failed", f"{how}: {lines[-1][:240] if lines else '(no stderr)'}")


def run_isolated(check: str, command: list[str], timeout: float = 600) -> list[dict]:
    """Rows of `command`, a process printing `RESULT <json rows>`; one failed row when it dies or prints none.

    Raises:
      subprocess.TimeoutExpired: the check hung for `timeout` seconds.
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(command, cwd=paths.REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not results:
        return [died(check, done.returncode, done.stderr)]
    return json.loads(results[-1][len("RESULT ") :])


def table(rows: list[dict]) -> list[str]:
    """The rows as a Markdown table."""
    lines = ["| check | what | result | detail |", "|---|---|---|---|"]
    lines += [f"| {r['check']} | {r['what']} | {r['result']} | {r['detail'].replace('|', '/')} |" for r in rows]
    return lines
