"""Running the trainer as a user does, `python -m trainer` in a fresh process from the repository's root, and
the flags of a run on CPU towers: one place for what the tests that start the trainer each spelled out."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT


def trainer_command(*args: str) -> list[str]:
    """`python -m trainer ARGS` with this interpreter: for a test that starts it itself (Popen: kills,
    signals, a log file, another working directory)."""
    return [sys.executable, "-m", "trainer", *args]


def run_trainer(*args: str, env: dict | None = None, timeout: float = 300, cwd=ROOT) -> subprocess.CompletedProcess:
    """`python -m trainer ARGS` run to its end from `cwd`, stdout and stderr captured as text. `env` is the
    process's whole environment (None: this process's, as it is now); a test builds it, since what it keeps
    or sets (CUDA_VISIBLE_DEVICES, TF_CPP_MIN_LOG_LEVEL, PYTHONPATH, SLURM_*) is part of what it tests."""
    return subprocess.run(trainer_command(*args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def cpu_flags(num_gpus: int | None = 2, **flags) -> list[str]:
    """The flags of a run on CPU towers: `--device=cpu`, `--num_gpus=N` (None: left out, the trainer's
    default), then each keyword in the order given: True as `--name`, False as `--noname`, anything else as
    `--name=value` (`export="false"` stays `--export=false`). No flag is added that the caller did not name."""
    rendered = ["--device=cpu"] + ([] if num_gpus is None else [f"--num_gpus={num_gpus}"])
    for name, value in flags.items():
        if value is True:
            rendered.append(f"--{name}")
        elif value is False:
            rendered.append(f"--no{name}")
        else:
            rendered.append(f"--{name}={value}")
    return rendered
