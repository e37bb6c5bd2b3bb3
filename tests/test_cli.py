"""`python -m trainer` end to end: flags.txt reproduces the run bitwise."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _trainer(*args):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-m", "trainer", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_flagfile_reproduces_the_run(tmp_path):
    first = tmp_path / "first"
    _trainer(
        "--device=cpu",
        "--num_gpus=2",
        "--micro_batches=4",
        "--global_batch_size=64",
        "--deterministic",
        "--seed=7",
        "--train_steps=8",
        "--log_every_steps=4",
        "--eval_every_steps=0",
        "--noexport",
        f"--model_dir={first}",
    )
    flags_text = (first / "flags.txt").read_text()
    assert "--seed=7\n" in flags_text and "--deterministic\n" in flags_text and "--micro_batches=4\n" in flags_text
    again = tmp_path / "again"
    result = _trainer(f"--flagfile={first / 'flags.txt'}", f"--model_dir={again}")
    assert "step       8/8" in result.stdout
    a = json.loads((first / "metrics.json").read_text())
    b = json.loads((again / "metrics.json").read_text())
    assert (a["global_step"], a["num_towers"], a["micro_batches"]) == (8, 2, 4)
    assert a["weights_sha256"] == b["weights_sha256"]
    assert a["eval_loss"] == b["eval_loss"]
