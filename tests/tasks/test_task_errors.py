"""Bad input around a task, through `python -m trainer` subprocesses: each is exactly one `error:` line on
stderr (naming the task, the feature and the file where there is one) and exit 2.

Twelve processes, three at a time: about 25 s on 2 cores.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess

import pytest

import data
from data.schema import Feature
from tests.support import tasks_example
from tests.support.paths import ROOT
from tests.support.runs import cpu_flags, run_trainer

ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
USER = "tests.support.tasks_example:Regression"
LONG_RECORD = 37  # the record of long-train.tfrecord holding 12 values (Padded's max_length is 8)

# name -> (flags, the expected stderr line: `{train}`, `{eval}` and `{bad}` stand for the files).
CASES = {
    "no_module": (
        ["--task=nosuch.module:X"],
        "--task='nosuch.module:X': cannot import module 'nosuch.module': No module named 'nosuch'",
    ),
    "no_attribute": (
        ["--task=tasks.base:nothing"],
        f"--task='tasks.base:nothing': module 'tasks.base' (from {ROOT}/tasks/base.py) has no attribute 'nothing'",
    ),
    "not_a_task": (["--task=json:loads"], "--task='json:loads': 'loads' is not a subclass of tasks.Task"),
    "unknown_built_in": (
        ["--task=nonsense"],
        "--task='nonsense': unknown task; built-in tasks are classify, lm, or name your own as 'package.module:Class'",
    ),
    "wrong_dtype": (
        [f"--task={USER}", "--train_data={bad}/ints.tfrecord"],
        "task 'regression': feature 'x' of {bad}/ints.tfrecord holds int64_list, the task reads float32",
    ),
    "too_long_in_training": (
        [
            "--task=tests.support.tasks_example:Padded",
            "--train_data={bad}/long-train.tfrecord",
            "--eval_data={bad}/short.tfrecord",
        ],
        f"--train_data task 'padded': feature 'x' of {{bad}}/long-train.tfrecord record {LONG_RECORD} has 12 values, "
        "more than its max_length 8",
    ),
    "nothing_to_serve": (
        ["--task=tests.support.tasks_example:Unserved", "--export"],
        "task 'regression': serving() returns no signature, so there is nothing to export; define serving(model) "
        "or pass --noexport",
    ),
    "metric_names_differ": (
        ["--task=tests.support.tasks_example:Misnamed"],
        "task 'regression': metrics() returned ['mae'], but metric_names declares ['rmse'] (same names, same order)",
    ),
    "tensor_as_python_bool": (
        ["--task=tests.support.tasks_example:Branching"],
        f"Branching.loss in {ROOT}/tests/support/tasks_example.py: Using a symbolic tf.Tensor as a Python bool is "
        "not allowed while the step traces; towerflow traces its graphs without autograph, as Keras fit does: "
        "write control flow on a tensor's value as an op (tf.cond, keras.ops.cond, tf.where)",
    ),
    "lm_heads": (["--task=lm", "--lm_heads=3", "--lm_width=128"], "--lm_heads (3) must divide --lm_width (128)"),
    "task_args_without_equals": (
        [f"--task={USER}", "--task_args=oops"],
        "--task_args (oops) must be KEY=VALUE entries; 'oops' is not",
    ),
    "task_args_bad_value": (
        [f"--task={USER}", "--task_args=hidden=x"],
        "task regression: --task_args=hidden=x must be a positive integer",
    ),
}
COMMON = cpu_flags(
    deterministic=True, global_batch_size=16, train_steps=30, eval_every_steps=0, log_every_steps=0, export=False
)


def _write_bad_records(directory: str) -> None:
    """ints.tfrecord: `x` as int64; long-train.tfrecord: `x` of 3..7 values, but 12 at LONG_RECORD (the first
    record, which the engine inspects before training, is fine); short.tfrecord: 10 good records."""
    ints = data.FeatureSchema.of({"x": Feature("int64", shape=(8,)), "y": Feature("float32")}, "writer")
    data.write_feature_records(f"{directory}/ints.tfrecord", [{"x": list(range(8)), "y": [1.0]}] * 40, ints)
    lists = data.FeatureSchema.of({"x": Feature("float32", max_length=16), "y": Feature("float32")}, "writer")
    examples = [{"x": [0.5] * (3 + i % 5), "y": [1.0]} for i in range(60)]
    examples[LONG_RECORD] = {"x": [0.5] * 12, "y": [1.0]}
    data.write_feature_records(f"{directory}/long-train.tfrecord", examples, lists)
    data.write_feature_records(f"{directory}/short.tfrecord", examples[:10], lists)


def _run(args: list[str], model_dir: str) -> subprocess.CompletedProcess:
    return run_trainer(*COMMON, *args, f"--model_dir={model_dir}", env=ENV)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{case: (CompletedProcess, the expected line)}, every case run once."""
    base = tmp_path_factory.mktemp("task_errors")
    train, evaluation = tasks_example.write_records(str(base / "good"))
    (base / "bad").mkdir()
    _write_bad_records(str(base / "bad"))
    paths = {"bad": str(base / "bad")}
    runs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        for name, (flags, line) in CASES.items():
            args = [flag.format(**paths) for flag in flags]
            if name != "lm_heads" and not any(a.startswith("--train_data") for a in args):
                args.append(f"--train_data={train}")
            if any(a.startswith("--train_data") for a in args) and not any(a.startswith("--eval_data") for a in args):
                args.append(f"--eval_data={evaluation}")
            runs[name] = (pool.submit(_run, args, str(base / name)), line.format(**paths))
        return {name: (future.result(), line) for name, (future, line) in runs.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_error_line_and_exit_2(results, case):
    done, line = results[case]
    assert (done.returncode, done.stderr) == (2, f"error: {line}\n"), done.stdout[-2000:]
    if case == "too_long_in_training":  # found while training (the first record, inspected before, is fine)
        assert "fresh start at step 0" in done.stdout and "input pipeline failed" in done.stdout, done.stdout


def test_the_refusals_are_documented():
    """docs/tasks.md's table of refusals holds each case's line as a user reads it (a file as FILE, the
    repository as ROOT)."""
    with open(os.path.join(ROOT, "docs", "tasks.md")) as f:
        page = f.read()
    shown = {
        name: re.sub(r"[{]+bad[}]+/[^ ]+", "FILE", line).replace(ROOT, "ROOT") for name, (_, line) in CASES.items()
    }
    undocumented = [name for name, line in shown.items() if f"`{line}" not in page]
    assert undocumented == [], undocumented
