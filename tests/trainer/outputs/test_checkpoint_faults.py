"""Checkpoints are verified on resume: a damaged newest checkpoint is skipped (saying why) for the newest one
that reads back whole, a lost state file is rebuilt, leftovers of interrupted saves are removed, a checkpoint
of another model still fails, and a run SIGKILLed while saving resumes bitwise."""

import gc
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.support.paths import ROOT
from tests.support.runs import cpu_flags, run_trainer, trainer_command
from trainer.loop.build import build
from trainer.loop.run import train
from trainer.outputs import checkpoint_files
from trainer.outputs.checkpoint import CheckpointMismatch

STEPS = 16  # the reference run; the "killed" run stopped after its step-12 checkpoint (ckpt-4, 8, 12 on disk)
DATA = "data-00000-of-00001"


def _config(make_config, model_dir, train_steps, **groups):
    """cnn (BatchNorm, Dropout) on 2 towers, a checkpoint every 4 steps, 3 kept. The learning rate is constant,
    so a 12-step run is exactly the first 12 steps of the 16-step one."""
    return make_config(
        model_dir=model_dir,
        optimizer={"schedule": "constant"},
        loop={"train_steps": train_steps, "checkpoint_every_steps": 4, "keep_checkpoints": 3},
        **groups,
    )


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("faults")


_RUNS: dict = {}


@pytest.fixture
def runs(make_config, module_dir):
    """(weights hash of the uninterrupted 16-step run, directory of the run killed after step 12), trained once
    per module."""
    if not _RUNS:
        reference = train(_config(make_config, module_dir / "reference", STEPS))
        train(_config(make_config, module_dir / "killed", 12))
        _RUNS.update(reference=reference["weights_sha256"], killed=module_dir / "killed")
    return _RUNS["reference"], _RUNS["killed"]


def _copy(source, tmp_path):
    shutil.copytree(source, tmp_path / "run")
    return tmp_path / "run"


def _truncate_data(run):
    path = run / "checkpoints" / f"ckpt-12.{DATA}"
    os.truncate(path, os.path.getsize(path) // 2)


def _flip_a_data_byte(run):
    path = run / "checkpoints" / f"ckpt-12.{DATA}"
    middle = os.path.getsize(path) // 2
    with open(path, "r+b") as f:
        f.seek(middle)
        byte = f.read(1)[0]
        f.seek(middle)
        f.write(bytes([byte ^ 0x01]))


def _delete_index(run):
    os.remove(run / "checkpoints" / "ckpt-12.index")


def _state(run) -> list[str]:
    state, problem = checkpoint_files.read_state(str(run / "checkpoints"))
    assert problem == ""
    return state.names


def _on_disk(run) -> list[str]:
    return sorted(name for name in os.listdir(run / "checkpoints") if name.startswith("ckpt-"))


def _files_of(*steps) -> list[str]:
    return sorted(f"ckpt-{s}.{suffix}" for s in steps for suffix in ("index", DATA))


@pytest.mark.parametrize(
    "damage, reason",
    [
        (_truncate_data, "data file truncated (OutOfRangeError: Read less bytes than requested"),
        (_flip_a_data_byte, "data file corrupted ("),  # DataLossError or InternalError, by where the byte is
        (_delete_index, "ckpt-12.index missing"),
    ],
)
def test_a_damaged_newest_checkpoint_is_skipped_for_the_previous_one(
    make_config, tmp_path, capsys, runs, damage, reason
):
    reference, killed = runs
    run = _copy(killed, tmp_path)
    damage(run)
    capsys.readouterr()
    metrics = train(_config(make_config, run, STEPS))
    out = capsys.readouterr().out
    assert f"skipped checkpoint ckpt-12: {reason}" in out
    assert "resuming from ckpt-8, the newest checkpoint that reads back whole" in out
    assert metrics["attempts"][-1]["resumed_from_step"] == 8
    assert metrics["weights_sha256"] == reference
    # ckpt-12 was saved again over the damaged one; ckpt-4 rotated away as usual
    assert _state(run) == ["ckpt-8", "ckpt-12", "ckpt-16"]
    assert _on_disk(run) == _files_of(8, 12, 16)
    assert checkpoint_files.unreadable(str(run / "checkpoints" / "ckpt-12")) is None


def _garble(run):
    state = (run / "checkpoints" / "checkpoint").read_bytes()
    (run / "checkpoints" / "checkpoint").write_bytes(state[:30] + b"\xff\x00\xfe")


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda run: os.remove(run / "checkpoints" / "checkpoint"), "missing"),
        (_garble, "garbled (UnicodeDecodeError: "),
    ],
)
def test_a_lost_state_file_is_rebuilt_and_rotation_goes_on(make_config, tmp_path, capsys, runs, damage, problem):
    reference, killed = runs
    run = _copy(killed, tmp_path)
    damage(run)
    capsys.readouterr()
    metrics = train(_config(make_config, run, STEPS))
    out = capsys.readouterr().out
    assert f"the checkpoint state file {run / 'checkpoints' / 'checkpoint'} is {problem}" in out
    assert "rebuilt it from ckpt-4, ckpt-8, ckpt-12 on disk" in out
    assert metrics["attempts"][-1]["resumed_from_step"] == 12
    assert metrics["weights_sha256"] == reference
    # the manager knew the rebuilt checkpoints: saving ckpt-16 rotated ckpt-4 away
    assert _state(run) == ["ckpt-8", "ckpt-12", "ckpt-16"]
    assert _on_disk(run) == _files_of(8, 12, 16)


def test_with_every_checkpoint_damaged_the_run_starts_over(make_config, tmp_path, capsys, runs):
    reference, killed = runs
    run = _copy(killed, tmp_path)
    for step in (4, 8, 12):
        os.truncate(run / "checkpoints" / f"ckpt-{step}.{DATA}", 100)
    capsys.readouterr()
    metrics = train(_config(make_config, run, STEPS))
    out = capsys.readouterr().out
    for step in (12, 8, 4):
        assert f"skipped checkpoint ckpt-{step}: data file truncated" in out
    assert f"no checkpoint in {run / 'checkpoints'} reads back whole; starting from step 0" in out
    assert metrics["attempts"][-1]["resumed_from_step"] == 0
    assert metrics["weights_sha256"] == reference
    assert _state(run) == ["ckpt-8", "ckpt-12", "ckpt-16"]  # the damaged ones were overwritten or rotated away


def test_a_checkpoint_saved_but_not_recorded_is_resumed_from(make_config, tmp_path, capsys, runs, module_dir):
    reference, killed = runs
    run = _copy(killed, tmp_path)
    # killed after writing ckpt-16's index, before recording it in the state file
    for name in _files_of(16):
        shutil.copy(module_dir / "reference" / "checkpoints" / name, run / "checkpoints" / name)
    capsys.readouterr()
    metrics = train(_config(make_config, run, STEPS))
    assert f"added ckpt-16 on disk but not in {run / 'checkpoints' / 'checkpoint'} to it" in capsys.readouterr().out
    assert metrics["attempts"][-1]["resumed_from_step"] == 16
    assert metrics["weights_sha256"] == reference
    assert _state(run) == ["ckpt-4", "ckpt-8", "ckpt-12", "ckpt-16"]  # ckpt-4 goes at the next save


def _fingerprint(trainer) -> str:
    """Weights hash over everything a checkpoint restores: model, optimizer, global step, and the next batch."""
    digest = hashlib.sha256()
    for value in [*trainer.model.variables, *trainer.optimizer.variables, trainer.global_step]:
        digest.update(np.asarray(value.numpy()).tobytes())
    for tensor in next(trainer.iterators[0]):
        digest.update(np.asarray(tensor).tobytes())
    return digest.hexdigest()


def test_the_older_checkpoint_overwrites_everything_a_newer_restore_left(make_config, tmp_path, runs):
    _, killed = runs
    run = _copy(killed, tmp_path)
    _truncate_data(run)
    damaged = build(_config(make_config, run, STEPS))
    # the state as a half-done restore leaves it
    damaged.checkpointer.checkpoint.restore(str(killed / "checkpoints" / "ckpt-12"))
    with pytest.raises(IndexError):  # what restoring the truncated checkpoint itself does
        damaged.checkpointer.checkpoint.restore(str(run / "checkpoints" / "ckpt-12"))
    assert damaged.checkpointer.restore_latest() == str(run / "checkpoints" / "ckpt-8")
    clean = build(_config(make_config, tmp_path / "clean", STEPS))
    clean.checkpointer.checkpoint.restore(str(killed / "checkpoints" / "ckpt-8"))
    assert int(damaged.global_step.numpy()) == 8
    assert _fingerprint(damaged) == _fingerprint(clean)


def test_a_checkpoint_of_another_model_fails_naming_it(make_config, tmp_path, capsys):
    train(_config(make_config, tmp_path / "run", 8, model={"name": "mlp"}))  # ckpt-4, ckpt-8
    capsys.readouterr()
    cnn = build(_config(make_config, tmp_path / "run", 8))
    with pytest.raises(
        CheckpointMismatch,
        match=r"cannot resume from .*/ckpt-8: it reads back whole but does not match this run's model/optimizer/data "
        r"\(ValueError: Received incompatible tensor with shape \(64, 256\) .* shape \(3, 3, 1, 32\)",
    ) as e:
        cnn.checkpointer.restore_latest()
    assert isinstance(e.value, RuntimeError)  # what run.py and callers expected before
    assert "skipped" not in capsys.readouterr().out  # a mismatch is not damage: no fallback to ckpt-4
    assert _state(tmp_path / "run") == ["ckpt-4", "ckpt-8"]
    assert _on_disk(tmp_path / "run") == _files_of(4, 8)
    # The refused restore's state, collected, logs no TensorFlow warning after the refusal ("... being deleted
    # with unrestored values", "Value in checkpoint could not be found ..."): the refusal said it.
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    tf.get_logger().addHandler(handler)
    try:
        del e, cnn  # the model holds the restore's state (its deferred values) until it goes
        gc.collect()
    finally:
        tf.get_logger().removeHandler(handler)
    assert not [m for m in logged if "unrestored" in m or "could not be found" in m], logged


def test_leftovers_of_interrupted_saves_are_removed(make_config, tmp_path, capsys, runs):
    reference, killed = runs
    run = _copy(killed, tmp_path)
    ckpts = run / "checkpoints"
    # what TF 2.21 left after SIGKILLs mid-save (data renamed but no index yet: its save never finished)
    (ckpts / "ckpt-16_temp").mkdir()
    (ckpts / "ckpt-16_temp" / f"part-00000-of-00001.{DATA}.tempstate15194492813513053019").write_bytes(b"x" * 100)
    (ckpts / f"ckpt-16.{DATA}").write_bytes(b"y" * 100)
    (ckpts / "checkpoint.tmp8e9d4c5a0b1f2e3d4c5b6a7980f1e2d3").write_text("model_checkpoint_path")
    for foreign in ("notes.txt", "ckpt-best_temp/", "ckpt-12.index.bak"):  # not names the manager writes
        (ckpts / foreign.rstrip("/")).mkdir() if foreign.endswith("/") else (ckpts / foreign).write_text("mine")
    capsys.readouterr()
    metrics = train(_config(make_config, run, STEPS))
    out = capsys.readouterr().out
    assert (
        f"removed what interrupted checkpoint saves left in {ckpts}: checkpoint.tmp8e9d4c5a0b1f2e3d4c5b6a7980f1e2d3, "
        f"ckpt-16.{DATA}, ckpt-16_temp/" in out
    )
    assert (ckpts / "notes.txt").exists() and (ckpts / "ckpt-best_temp").is_dir()
    assert (ckpts / "ckpt-12.index.bak").exists()
    assert metrics["attempts"][-1]["resumed_from_step"] == 12
    assert metrics["weights_sha256"] == reference
    assert _on_disk(run) == sorted([*_files_of(8, 12, 16), "ckpt-12.index.bak", "ckpt-best_temp"])


def _flags(model_dir) -> list[str]:
    flags = cpu_flags(
        global_batch_size=64,
        model="mlp",
        deterministic=True,
        lr_schedule="constant",
        train_steps=40,
        checkpoint_every_steps=1,
        keep_checkpoints=3,
        log_every_steps=0,
        eval_every_steps=0,
        histogram_every_steps=0,
        export=False,
    )
    return [*flags, f"--model_dir={model_dir}"]


def _trainer_command(model_dir) -> list[str]:
    return trainer_command(*_flags(model_dir))


def _run_trainer(model_dir) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = run_trainer(*_flags(model_dir), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((model_dir / "metrics.json").read_text())


def _recorded_step(model_dir) -> int:
    state, _ = checkpoint_files.read_state(str(model_dir / "checkpoints"))
    return checkpoint_files.number(state.names[-1]) if state else 0


def _wait_until(predicate, process, timeout_sec=120.0) -> None:
    deadline = time.monotonic() + timeout_sec
    while not predicate() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)


def _kill_while_saving(model_dir, delay_sec: float, log_path) -> tuple[int, list[str]]:
    """Starts the trainer; once it has recorded a checkpoint and begun the next save (a `ckpt-N_temp/` folder
    appears: it saves every step), SIGKILLs it `delay_sec` later. Returns the newest recorded step after the
    kill and the names of the save it interrupted."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    before = _recorded_step(model_dir)
    with open(log_path, "w") as log:
        process = subprocess.Popen(_trainer_command(model_dir), cwd=ROOT, env=env, stdout=log, stderr=log)
        _wait_until(lambda: _recorded_step(model_dir) > before, process)
        _wait_until(lambda: any(name.endswith("_temp") for name in os.listdir(model_dir / "checkpoints")), process)
        time.sleep(delay_sec)
        process.send_signal(signal.SIGKILL)
        assert process.wait() == -signal.SIGKILL, f"the trainer ended before the kill: {log_path}"
    recorded = _recorded_step(model_dir)
    names = os.listdir(model_dir / "checkpoints")
    unfinished = [n for n in names if "_temp" in n or n.startswith(f"ckpt-{recorded + 1}.")]
    return recorded, sorted(unfinished)


def test_sigkill_while_saving_every_step_resumes_bitwise(make_config, tmp_path):
    # The uninterrupted run's weights, trained here: _flags' run without its 40 saves (they change no bit) and
    # without a TensorFlow start of its own.
    reference = train(
        make_config(
            model_dir=tmp_path / "reference",
            model={"name": "mlp"},
            optimizer={"schedule": "constant"},
            loop={"train_steps": 40, "log_every_steps": 0},
        )
    )
    rng = random.Random(20)
    run = tmp_path / "run"
    trials = []
    for trial in range(5):
        step, unfinished = _kill_while_saving(run, rng.uniform(0.0, 0.03), tmp_path / f"trial{trial}.log")
        print(f"trial {trial}: killed with ckpt-{step} recorded; left unfinished: {unfinished}")
        # the kill leaves at most the files of the one save in progress, that of the step after the recorded one
        assert all(name.startswith((f"ckpt-{step + 1}.", f"ckpt-{step + 1}_temp")) for name in unfinished), unfinished
        trials.append((step, unfinished))
    metrics = _run_trainer(run)
    assert metrics["weights_sha256"] == reference["weights_sha256"] and metrics["global_step"] == 40
    resumed = [a["resumed_from_step"] for a in metrics["attempts"]]
    assert resumed[0] == 0 and len(resumed) == 6
    for (step, unfinished), resumed_from in zip(trials, resumed[1:], strict=True):
        assert resumed_from in (step, step + 1)
        if resumed_from == step + 1:  # saved whole (its index written), killed before the state file recorded it
            assert f"ckpt-{step + 1}.index" in unfinished, (step, unfinished)
    assert _on_disk(run) == _files_of(38, 39, 40)  # no leftover of any interrupted save
