"""Where the benchmarks run from and where their results are kept: decided here, read everywhere else."""

from __future__ import annotations

import os

# benchmarks/harness/paths.py -> the repository: subprocesses (`python -m trainer`, the workers) run from it.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The recorded results (JSON, RESULTS.md and its pages, figures), apart from the code that makes them.
RESULTS_DIR = os.path.join(REPO_ROOT, "benchmarks", "results")


def result_path(name: str) -> str:
    """The path of the recorded result file `name` (e.g. "wire.json")."""
    return os.path.join(RESULTS_DIR, name)
