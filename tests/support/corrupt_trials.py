"""Corruption trials (issue #20): damage one file a run wrote at random bytes, rerun, and classify the rerun.

    python -m tests.support.corrupt_trials --trials=200 [--seed=0] [--workdir=DIR] [--kinds=run_json,metrics]

A short digits run (30 steps, a checkpoint every 10, 3 kept) is stopped at a checkpoint in one of two ways:
`resume` trained to step 20 and is rerun to 30; `finished` trained to 30 and is rerun at 30 (which reads
metrics.json). Between the two starts one file of the model_dir is damaged (flip bytes, truncate, zero a
range, append garbage). The rerun is then one of:
  (a) exit 0 with the weights of an uninterrupted 30-step run (metrics.json's weights_sha256);
  (b) exit 2 with one `error:` line naming the file, and deleting that file makes the next rerun (a);
  (c) anything else: exit 1, a traceback, a hang, wrong weights, or a (b) whose next rerun still fails.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

from tests.support import runs
from tests.support.runs import cpu_flags

FLAGS = cpu_flags(
    checkpoint_every_steps=10,
    keep_checkpoints=3,
    log_every_steps=10,
    eval_every_steps=10,
    lr_schedule="constant",
    deterministic=True,
    export=False,
)
STEPS, STOPPED_AT = 30, 20
KINDS = {  # file kind -> glob under the model_dir
    "checkpoint_data": "checkpoints/ckpt-*.data-*",
    "checkpoint_index": "checkpoints/ckpt-*.index",
    "state_file": "checkpoints/checkpoint",
    "events": "**/events.out.tfevents.*",
    "attempts": "attempts.json",
    "metrics": "metrics.json",
    "run_json": "run.json",
    "flags_txt": "flags.txt",
    "flags_history": "flags.history",
    "lock": ".lock",
}
MODES = ("flip", "truncate", "zero", "append")
SCENARIOS = ("resume", "finished")
TIMEOUT_SEC = 240


@dataclasses.dataclass
class Trial:
    kind: str
    scenario: str
    mode: str
    file: str = ""
    damage: str = ""
    outcome: str = ""  # a, b or c
    detail: str = ""


def run_trainer(model_dir: str, steps: int) -> tuple[int | None, str, str]:
    """(exit code or None after a hang, stdout, stderr) of `python -m trainer` on the digits."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    try:
        done = runs.run_trainer(
            *FLAGS, f"--train_steps={steps}", f"--model_dir={model_dir}", env=env, timeout=TIMEOUT_SEC
        )
    except subprocess.TimeoutExpired as e:
        return None, str(e.stdout or ""), str(e.stderr or "")
    return done.returncode, done.stdout, done.stderr


def weights_of(model_dir: str) -> str | None:
    try:
        with open(os.path.join(model_dir, "metrics.json")) as f:
            return json.load(f).get("weights_sha256")
    except (OSError, ValueError, AttributeError):
        return None


def prepare(workdir: str) -> tuple[str, dict[str, str]]:
    """Trains the two runs the trials copy once; (reference hash, scenario -> dir). The `finished` run is an
    uninterrupted 30-step run, so its weights are the reference (a trial damages a copy, never the run itself);
    a `resume` trial reaching them checks a resume against an independent run."""
    bases = {}
    for name, steps in (("resume", STOPPED_AT), ("finished", STEPS)):
        path = os.path.join(workdir, name)
        if weights_of(path) is None:
            shutil.rmtree(path, ignore_errors=True)
            code, _, err = run_trainer(path, steps)
            if code != 0:
                raise RuntimeError(f"the {name} run failed ({code}): {err[-2000:]}")
        bases[name] = path
    return weights_of(bases["finished"]), bases


def corrupt(path: str, mode: str, rng: random.Random) -> str:
    """Damages `path` in place; returns what was done."""
    with open(path, "rb") as f:
        content = bytearray(f.read())
    size = len(content)
    if mode == "flip" and size:
        offsets = sorted(rng.sample(range(size), min(size, rng.randint(1, 8))))
        for offset in offsets:
            content[offset] ^= rng.randint(1, 255)
        what = f"flipped bytes at {offsets}"
    elif mode == "truncate" and size:
        content = content[: rng.randrange(size)]
        what = f"truncated {size} -> {len(content)} bytes"
    elif mode == "zero" and size:
        start = rng.randrange(size)
        length = min(size - start, rng.randint(1, 64))
        content[start : start + length] = bytes(length)
        what = f"zeroed {length} bytes at {start}"
    else:
        extra = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        content += extra
        what = f"appended {len(extra)} bytes"
    with open(path, "wb") as f:
        f.write(content)
    return what


def classify(trial: Trial, run: str, reference: str) -> None:
    """Reruns `run` and sets the trial's outcome (a, b or c) and detail."""
    code, out, err = run_trainer(run, STEPS)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    if code == 0:
        same = weights_of(run) == reference
        trial.outcome, trial.detail = ("a", _said(out, trial.file)) if same else ("c", "exit 0 with other weights")
    elif code == 2 and len(errors) == 1 and os.path.basename(trial.file) in errors[0]:
        os.remove(os.path.join(run, trial.file))
        code, _, err = run_trainer(run, STEPS)  # the message's plain way out: without the named file
        ok = code == 0 and weights_of(run) == reference
        trial.outcome = "b" if ok else "c"
        trial.detail = errors[0] if ok else f"after deleting it, exit {code}: {_last(err)}"
    else:
        trial.outcome = "c"
        trial.detail = "hang" if code is None else f"exit {code}: {_last(err)}"


def _said(out: str, file: str) -> str:
    """The first line of the rerun's output naming the damaged file, or what the run did."""
    lines = [line for line in out.splitlines() if os.path.basename(file) in line or "skipped" in line]
    return lines[0][:200] if lines else "resumed"


def _last(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def trial(workdir: str, bases: dict[str, str], reference: str, plan: Trial, rng: random.Random, n: int) -> Trial:
    run = os.path.join(workdir, f"trial-{n}")
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(bases[plan.scenario], run)
    candidates = sorted(os.path.relpath(p, run) for p in glob.glob(os.path.join(run, KINDS[plan.kind]), recursive=True))
    if not candidates:
        plan.outcome, plan.detail = "-", "no such file"
        return plan
    plan.file = rng.choice(candidates)
    plan.damage = corrupt(os.path.join(run, plan.file), plan.mode, rng)
    classify(plan, run, reference)
    if plan.outcome != "c":
        shutil.rmtree(run, ignore_errors=True)  # failures are kept for a look
    return plan


def plans(count: int, rng: random.Random, kinds: list[str]) -> list[Trial]:
    """`count` trials, the kinds in turn, mode and scenario at random (metrics.json mostly `finished`: a
    resume below --train_steps never reads it)."""
    made = []
    for n in range(count):
        kind = kinds[n % len(kinds)]
        scenario = "finished" if kind == "metrics" and rng.random() < 0.8 else rng.choice(SCENARIOS)
        made.append(Trial(kind, scenario, rng.choice(MODES)))
    return made


def table(trials: list[Trial]) -> str:
    """A markdown table: file kind x outcome counts."""
    counts = collections.Counter((t.kind, t.outcome) for t in trials)
    lines = ["| file kind | trials | (a) same weights | (b) exit 2 naming it | (c) failure |", "|---|---|---|---|---|"]
    for kind in KINDS:
        row = [counts[(kind, o)] for o in "abc"]
        if sum(row):
            lines.append(f"| {kind} | {sum(row)} | " + " | ".join(map(str, row)) + " |")
    total = [sum(counts[(k, o)] for k in KINDS) for o in "abc"]
    lines.append(f"| all | {sum(total)} | " + " | ".join(map(str, total)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="default: a new temporary directory")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated file kinds")
    parser.add_argument("--log", default=None, help="append each trial as a JSON line to this file")
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="corrupt-trials-")
    os.makedirs(workdir, exist_ok=True)
    reference, bases = prepare(workdir)
    rng = random.Random(args.seed)
    done = []
    for n, plan in enumerate(plans(args.trials, rng, args.kinds.split(","))):
        done.append(trial(workdir, bases, reference, plan, rng, n))
        print(json.dumps(dataclasses.asdict(done[-1])), flush=True)
        if args.log:
            with open(args.log, "a") as f:
                f.write(json.dumps(dataclasses.asdict(done[-1])) + "\n")
    print(table(done))
    return 1 if any(t.outcome == "c" for t in done) else 0


if __name__ == "__main__":
    sys.exit(main())
