"""A disk that fills up mid-run: the run ends with a one-line error naming the last whole checkpoint, and
once space is freed the rerun resumes from it to the weights of an uninterrupted run. Needs root (tmpfs)."""

import json
import os
import subprocess
import sys

import pytest

from trainer.system import stop as stop_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = [
    "--device=cpu",
    "--num_gpus=2",
    "--micro_batches=2",
    "--global_batch_size=64",
    "--deterministic",
    "--train_steps=60",
    "--log_every_steps=20",
    "--eval_every_steps=0",
    "--checkpoint_every_steps=5",
    "--keep_checkpoints=20",
    "--histogram_every_steps=0",
    "--noexport",
]


def _trainer(model_dir):
    command = [sys.executable, "-m", "trainer", *FLAGS, f"--model_dir={model_dir}"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mount_point)], check=True)
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=False)


def test_a_full_disk_ends_the_run_cleanly_and_the_rerun_resumes_bitwise(tmp_path, small_disk):
    reference = _trainer(tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr[-2000:]
    full = _trainer(small_disk / "run")
    assert full.returncode == stop_lib.EXIT_FAILED, full.stdout[-1000:] + full.stderr[-2000:]
    error = full.stderr.strip().splitlines()[-1]
    assert error.startswith("error: no space left on device saving the checkpoint of step ")
    assert "the last whole checkpoint is" in error and "Traceback" not in full.stderr
    last = int(error.split("the last whole checkpoint is ")[1].split("ckpt-")[1].split(".")[0])
    assert 0 < last < 60
    subprocess.run(["mount", "-o", "remount,size=200m", str(small_disk)], check=True)
    resumed = _trainer(small_disk / "run")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {small_disk / 'run' / 'checkpoints'}/ckpt-{last} at step {last}" in resumed.stdout
    metrics = json.loads((small_disk / "run" / "metrics.json").read_text())
    expected = json.loads((tmp_path / "reference" / "metrics.json").read_text())
    assert metrics["weights_sha256"] == expected["weights_sha256"]
