"""Running the trainer as a user does, `python -m trainer` in a fresh process from the repository's root, and
the flags of a run on CPU towers: one place for what the tests that start the trainer each spelled out."""

from __future__ import annotations

import contextlib
import io
import os
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


LM_SIZES = ("--lm_layers=1", "--lm_heads=2", "--lm_width=16", "--lm_context=32")


def trained_lm_run(root, tokens: str, *prepare_flags: str, chars: int, steps: int, batch: int):
    """`root/records`: `python -m data.prepare text` (in this process) of the default corpus's first `chars`
    characters as `tokens` (context 32); `root/run`: a `--task=lm` run of `steps` steps on them (LM_SIZES), with
    its export. For the tests that read a trained language model's run directory or export."""
    from data import prepare
    from data import text as text_data

    (root / "text.txt").write_text(text_data.default_corpus()[0][:chars], encoding="utf-8")
    argv = ["text", str(root / "text.txt"), str(root / "records"), "--context=32", f"--tokens={tokens}"]
    with contextlib.redirect_stdout(io.StringIO()):  # its --train_data= lines: not a test's output
        assert prepare.main([*argv, *prepare_flags]) == 0
    data = [f"--train_data={root / 'records' / 'train-*'}", f"--eval_data={root / 'records' / 'eval-*'}"]
    env = dict(os.environ, PYTHONPATH=ROOT)  # this checkout's data/ and trainer/, whatever the cwd
    done = run_trainer(
        "--device=cpu", "--task=lm", *LM_SIZES, f"--train_steps={steps}", *data, f"--global_batch_size={batch}",
        f"--model_dir={root / 'run'}", "--export", env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (root / "run.stdout").write_text(done.stdout)  # its console, for the tests of what a run prints
    (root / "run.stderr").write_text(done.stderr)
    return root


# What metrics.json says about where and how fast a run went, not about what it computed.
LAYOUT_AND_TIMING = ("examples_per_sec", "attempts", "num_towers", "towers_per_task", "devices", "parameter_devices")


def computed(metrics: dict) -> dict:
    """metrics.json less its layout and timing entries: what must be equal on every layout of one run."""
    return {k: v for k, v in metrics.items() if k not in LAYOUT_AND_TIMING}
