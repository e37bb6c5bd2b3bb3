"""A disk that fills up mid-run (saving a checkpoint, writing TensorBoard events, exporting): the run ends with
exit 75 and a one-line error naming the last whole checkpoint, and once space is freed the rerun resumes from
it to the weights of an uninterrupted run. Needs root (tmpfs)."""

import json
import os
import subprocess

import pytest

from tests.support.runs import cpu_flags, run_trainer
from trainer.loop.run import train
from trainer.system import stop as stop_lib

FLAGS = cpu_flags(
    micro_batches=2,
    global_batch_size=64,
    deterministic=True,
    train_steps=60,
    log_every_steps=20,
    eval_every_steps=0,
    checkpoint_every_steps=5,
    keep_checkpoints=20,
    histogram_every_steps=0,
    export=False,
)


def _trainer(model_dir, *extra):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as a user's shell: TF quiet
    return run_trainer(*FLAGS, *extra, f"--model_dir={model_dir}", env=env)


@pytest.fixture
def small_disk(tmp_path, request):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    size = getattr(request, "param", "12m")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], check=True)
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=False)


def _reference(make_config, tmp_path, train_steps: int) -> str:
    """The weights of FLAGS' run to `train_steps`, uninterrupted, trained in the test's process (no TensorFlow
    start of its own) without checkpoints, events or export: they change no bit."""
    config = make_config(
        model_dir=tmp_path / "reference", towers={"micro_batches": 2}, loop={"train_steps": train_steps}
    )
    return train(config)["weights_sha256"]


def test_a_full_disk_ends_the_run_cleanly_and_the_rerun_resumes_bitwise(make_config, tmp_path, small_disk):
    reference = _reference(make_config, tmp_path, 60)
    full = _trainer(small_disk / "run")
    assert full.returncode == stop_lib.EXIT_RESUMABLE, full.stdout[-1000:] + full.stderr[-2000:]
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
    assert metrics["weights_sha256"] == reference


def _one_line_error(result) -> str:
    """The error line: the last on stderr (a warning that attempts.json could not be written may precede it)."""
    assert result.returncode == stop_lib.EXIT_RESUMABLE, result.stdout[-1000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def _resumes_to_the_reference(reference: str, disk, step: int, *extra) -> None:
    subprocess.run(["mount", "-o", "remount,size=200m", str(disk)], check=True)
    resumed = _trainer(disk / "run", *extra)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {disk / 'run' / 'checkpoints'}/ckpt-{step} at step {step}" in resumed.stdout
    assert json.loads((disk / "run" / "metrics.json").read_text())["weights_sha256"] == reference


# Histograms every step grow the events by ~16 KB a step; a checkpoint is 1.2 MB. On 4 MB, the checkpoint of
# step 100 fits and the events fill the disk before step 200, the last (at step 174 on 2026-11-28: 26 steps,
# ~420 KB, to spare; 300 steps trained 100 more twice, in the reference and the resume, for nothing). The
# uninterrupted reference (`_reference`) trains the same steps without the per-step log lines, histograms and
# checkpoints (the weights are the same; a third of the CPU).
EVENTS = ("--train_steps=200", "--log_every_steps=1", "--histogram_every_steps=1", "--checkpoint_every_steps=100")


@pytest.mark.parametrize("small_disk", ["4m"], indirect=True)
def test_a_disk_filled_by_events_ends_the_run_with_75_and_one_line(make_config, tmp_path, small_disk):
    reference = _reference(make_config, tmp_path, 200)
    error = _one_line_error(_trainer(small_disk / "run", *EVENTS))
    assert error.startswith(f"error: no space left on device writing to {small_disk / 'run'} (TensorBoard events)")
    assert error.endswith(
        f"the last whole checkpoint is {small_disk / 'run' / 'checkpoints'}/ckpt-100. Free space "
        "and rerun the same command to resume."
    )
    _resumes_to_the_reference(reference, small_disk, 100, *EVENTS)


# One checkpoint (1.2 MB) fits on 2 MB, the SavedModel after it (1.4 MB) does not. The reference's weights are
# what the resumed run must reach; its export is not looked at, so it makes none.
EXPORT = ("--train_steps=20", "--checkpoint_every_steps=0", "--export")


@pytest.mark.parametrize("small_disk", ["2m"], indirect=True)
def test_a_disk_filled_by_the_export_ends_the_run_with_75_and_one_line(make_config, tmp_path, small_disk):
    reference = _reference(make_config, tmp_path, 20)
    error = _one_line_error(_trainer(small_disk / "run", *EXPORT))
    assert error.startswith(f"error: no space left on device exporting to {small_disk / 'run'}; the last whole ")
    _resumes_to_the_reference(reference, small_disk, 20, *EXPORT)
    assert (small_disk / "run" / "export" / "20" / "saved_model.pb").exists()
