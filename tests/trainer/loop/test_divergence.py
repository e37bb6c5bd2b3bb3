"""Divergence: a non-finite loss or gradient stops the run at once (exit 3), its update is never applied,
no non-finite weight is checkpointed or exported, the last finite checkpoint stays, metrics stay strict JSON."""

import json
import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from tests.support.runs import cpu_flags, run_trainer
from trainer.loop.build import build
from trainer.loop.run import train
from trainer.outputs import report
from trainer.system import stop as stop_lib


def _checkpoint_weights_finite(path: str) -> bool:
    reader = tf.train.load_checkpoint(path)
    floats = [name for name, dtype in reader.get_variable_to_dtype_map().items() if dtype.is_floating]
    assert any("_trainable_variables" in name for name in floats)
    return all(np.all(np.isfinite(reader.get_tensor(name))) for name in floats)


@pytest.mark.parametrize("update_mode", ["sync", "async"])
def test_huge_learning_rate_stops_within_one_update(make_config, tmp_path, update_mode):
    config = make_config(
        deterministic=update_mode == "sync",
        towers={"update_mode": update_mode, "num_towers": 2, "micro_batches": 2},
        optimizer={"name": "sgd", "learning_rate": 1e6, "schedule": "constant"},
        loop={"train_steps": 300, "log_every_steps": 100, "checkpoint_every_steps": 1, "keep_checkpoints": 1},
    )
    # the loss or gradient is caught before its update; a weight that overflowed in a finite update, before
    # the save that would have kept it
    with pytest.raises(
        stop_lib.Diverged, match=r"not finite at step (\d+); (that update was not applied|not saving)"
    ) as e:
        train(config)
    bad_step = int(e.value.args[0].split("at step ")[1].split(";")[0])
    latest = tf.train.latest_checkpoint(str(tmp_path / "run" / "checkpoints"))
    # every step before the bad one was checkpointed (keep 1): exactly the last finite one is on disk
    assert latest is not None and latest.endswith(f"ckpt-{bad_step - 1}")
    assert _checkpoint_weights_finite(latest)
    assert not os.path.exists(tmp_path / "run" / "metrics.json")
    attempts = json.loads((tmp_path / "run" / "attempts.json").read_text())
    assert attempts[-1]["outcome"].startswith("diverged:") and attempts[-1]["step"] == bad_step - 1
    if update_mode == "sync":  # names the micro-batch and tower whose loss overflowed, else says the gradient did
        assert re.search(r"the loss of micro-batch \d+ \(tower \d+\)|the gradient was not finite", str(e.value))


def test_the_weights_are_those_before_the_bad_update(make_config, tmp_path):
    config = make_config(
        towers={"num_towers": 2, "micro_batches": 2},
        optimizer={"name": "sgd", "learning_rate": 1e6, "schedule": "constant"},
        loop={"train_steps": 300},
    )
    trainer = build(config)
    with pytest.raises(stop_lib.Diverged):
        for _ in range(300):
            trainer.updater.train_steps(1)
    step = int(trainer.global_step.numpy())
    assert step >= 1 and report.weights_sha256(trainer.model.variables)  # readable, and finite:
    assert all(np.all(np.isfinite(v.numpy())) for v in trainer.model.variables if v.dtype == "float32")


def test_cli_exits_3_and_writes_strict_json(tmp_path):
    flags = cpu_flags(learning_rate="1e6", optimizer="sgd", lr_schedule="constant", train_steps=200)
    result = run_trainer(*flags, f"--model_dir={tmp_path}/run")
    assert result.returncode == stop_lib.EXIT_DIVERGED, result.stderr[-2000:]
    assert "error: training diverged:" in result.stderr and "Traceback" not in result.stderr


def test_metrics_json_is_strict():
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"strict-{os.getpid()}.json")
    report.write_json(path, {"loss": float("nan"), "x": [math.inf, 1.5], "n": np.float32(2.0)})
    with open(path) as f:
        text = f.read()
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}")) == {
        "loss": None,
        "n": 2.0,
        "x": [None, 1.5],
    }
    os.remove(path)
