"""A user's own task (tests/support/tasks_example.py `Regression`, written against docs/tasks.md only), trained end to
end by `python -m trainer --task=tests.support.tasks_example:Regression` subprocesses: it learns, metrics.json carries
its metric, the export serves what eval computed, the bits are the same on 1 and 2 towers at a fixed number of
micro-batches, and a run SIGKILLed after a checkpoint resumes to the uninterrupted run's weights.

Four trainer runs and one serving process, two at a time (the machine has 2 cores): about 40 s.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.support import tasks_example
from tests.support.paths import ROOT
from tests.support.runs import computed, trainer_command

ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
STEPS = 200
KILL_AFTER_STEP = 20
FLAGS = (
    "--task=tests.support.tasks_example:Regression",
    "--task_args=hidden=16",
    "--device=cpu",
    "--deterministic",
    "--global_batch_size=32",
    "--micro_batches=2",
    f"--train_steps={STEPS}",
    "--learning_rate=0.05",
    "--eval_every_steps=0",
    "--log_every_steps=50",  # train_mae: the mean over the last 50 steps
)
# The best eval MAE a model can reach is the noise's, NOISE * sqrt(2 / pi) = 0.080; predicting the mean of y
# gives about |W_TRUE| * sqrt(2 / pi) = 1.48, and the untrained model's first step measured 1.53. Measured
# after 200 steps: eval 0.0866, train (steps 151-200) 0.0792. The bound leaves 15% of room above the eval
# figure and is 1/15 of the untrained one.
EVAL_MAE_BOUND = 0.1


def _start(model_dir, patterns, *extra) -> subprocess.Popen:
    train, evaluation = patterns
    command = trainer_command(*FLAGS, f"--train_data={train}", f"--eval_data={evaluation}")
    command += [f"--model_dir={model_dir}", *extra]
    log = open(f"{model_dir}.log", "w")  # noqa: SIM115 (closed with the process, in _finish)
    return subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT)


def _finish(process: subprocess.Popen, model_dir) -> dict:
    code = process.wait(timeout=300)
    process.stdout and process.stdout.close()
    with open(f"{model_dir}.log") as f:
        assert code == 0, f.read()[-3000:]
    with open(os.path.join(model_dir, "metrics.json")) as f:
        return json.load(f)


def _recorded_step(model_dir) -> int:
    """The newest step TensorFlow's checkpoint state file records (0 before the first save)."""
    try:
        with open(os.path.join(model_dir, "checkpoints", "checkpoint")) as f:
            return int(re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', f.read(), re.MULTILINE).group(1))
    except (FileNotFoundError, AttributeError):  # not written yet, or caught mid-write
        return 0


def _kill_after_checkpoint(model_dir, patterns) -> int:
    """Starts a run that saves every step, SIGKILLs it once a checkpoint of step >= KILL_AFTER_STEP is
    recorded; returns that recorded step."""
    process = _start(model_dir, patterns, "--checkpoint_every_steps=1", "--noexport")
    deadline = time.monotonic() + 120
    while _recorded_step(model_dir) < KILL_AFTER_STEP and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the run ended before the kill"
    return _recorded_step(model_dir)


_SERVE = """
import json, sys
import numpy as np, tensorflow as tf
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
records = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(sys.argv[2])]
x = np.array([r.features.feature["x"].float_list.value for r in records], np.float32)
y = np.array([r.features.feature["y"].float_list.value[0] for r in records], np.float32)
err = serve(x=tf.constant(x))["y"].numpy().astype(np.float64) - y
print(json.dumps({"mae": float(np.abs(err).mean()), "mse": float((err ** 2).mean()), "n": len(y)}))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: metrics.json} of the reference (2 towers), one tower, and the killed-and-resumed run; and
    `served`, what the reference's export gives for the eval records in a fresh process."""
    base = tmp_path_factory.mktemp("user_task")
    patterns = tasks_example.write_records(str(base / "data"))
    dirs = {name: base / name for name in ("reference", "one_tower", "resumed")}
    reference = _start(dirs["reference"], patterns, "--num_gpus=2")
    one_tower = _start(dirs["one_tower"], patterns, "--num_gpus=1", "--noexport")
    out = {"reference": _finish(reference, dirs["reference"]), "one_tower": _finish(one_tower, dirs["one_tower"])}
    export = os.path.join(dirs["reference"], "export", str(STEPS))
    served = subprocess.Popen(
        [sys.executable, "-c", _SERVE, export, patterns[1]], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True
    )
    out["killed_at"] = _kill_after_checkpoint(dirs["resumed"], patterns)
    resumed = _start(dirs["resumed"], patterns, "--num_gpus=2", "--checkpoint_every_steps=1", "--noexport")
    out["resumed"] = _finish(resumed, dirs["resumed"])
    stdout, _ = served.communicate(timeout=300)
    assert served.returncode == 0
    out["served"] = json.loads(stdout)
    return out


def test_it_trains_and_reports_its_metric(runs):
    metrics = runs["reference"]
    assert metrics["global_step"] == STEPS and metrics["eval_examples"] == 200
    assert metrics["eval_mae"] < EVAL_MAE_BOUND, metrics["eval_mae"]
    assert metrics["train_mae"] < EVAL_MAE_BOUND, metrics["train_mae"]
    assert {"train_loss", "train_mae", "eval_loss", "eval_mae"} <= set(metrics)
    assert not {"train_accuracy", "eval_accuracy"} & set(metrics)


def test_export_serves_what_eval_computed(runs):
    """A fresh process loads export/<step>/ and scores the eval records itself."""
    served, metrics = runs["served"], runs["reference"]
    assert served["n"] == metrics["eval_examples"]
    assert abs(served["mae"] - metrics["eval_mae"]) < 1e-5, (served, metrics["eval_mae"])
    assert abs(served["mse"] - metrics["eval_loss"]) < 1e-5, (served, metrics["eval_loss"])


def test_same_bits_on_one_and_two_towers(runs):
    assert runs["one_tower"]["num_towers"] == 1 and runs["reference"]["num_towers"] == 2
    assert runs["one_tower"]["micro_batches"] == runs["reference"]["micro_batches"] == 2
    assert runs["one_tower"]["weights_sha256"] == runs["reference"]["weights_sha256"]
    # and the same eval figures, bit for bit: metrics.json is one file but for timings and devices
    one, two = computed(runs["one_tower"]), computed(runs["reference"])
    evaluated = sorted(k for k in two if k.startswith("eval_"))
    assert evaluated == ["eval_examples", "eval_loss", "eval_mae"]
    assert [one[k] for k in evaluated] == [two[k] for k in evaluated]  # exact float equality
    assert one == two
    assert two["model"] == "regression_mlp16"  # the user's model, by its Keras name (Task.model_description)


def test_killed_run_resumes_to_the_uninterrupted_weights(runs):
    killed_at, resumed = runs["killed_at"], runs["resumed"]
    assert KILL_AFTER_STEP <= killed_at < STEPS
    assert [a["resumed_from_step"] for a in resumed["attempts"]] == [0, killed_at]
    assert resumed["global_step"] == STEPS
    assert resumed["weights_sha256"] == runs["reference"]["weights_sha256"]
