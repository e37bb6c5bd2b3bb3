"""The determinism contract: bitwise-identical weights on a rerun, across tower counts, and after resume."""

import dataclasses
import glob
import json
import os
import shutil

import pytest
import tensorflow as tf

import data
from tests.support.console import on_line
from tests.support.runs import computed
from trainer.loop import run as run_lib
from trainer.loop.build import build
from trainer.loop.run import train
from trainer.outputs import report
from trainer.system import devices

# One xdist worker for the module: the runs several tests share (`_initial_weights`, `_shared`) are trained once.
pytestmark = pytest.mark.xdist_group("determinism")

STEPS = 12
# The line a run prints once it is built (its streams, and a cache, made) and before its first step.
STARTING = r"^attempt \d+ \("
_INITIAL = {}
_SHARED = {}  # (num_towers, micro_batches, train_steps) -> the metrics of that run, trained once per module


def _initial_weights(make_config, tmp_path) -> str:
    """The hash of the weights every run here starts from (cnn, seed 0), built once per module."""
    if not _INITIAL:
        _INITIAL["cnn"] = report.weights_sha256(build(make_config(model_dir=tmp_path / "init")).model.variables)
    return _INITIAL["cnn"]


def _own_digits(tmp_path, name: str) -> dict:
    """A copy of the digits' training files for one run to damage, and the data settings that read it."""
    train_glob, eval_glob = data.ensure_digits()
    os.makedirs(tmp_path / name)
    for path in glob.glob(train_glob):
        shutil.copy(path, tmp_path / name)
    own = str(tmp_path / name / os.path.basename(train_glob))
    return {"train_data": own, "eval_data": eval_glob, "num_classes": 10}


def _zero_once_started(monkeypatch, settings: dict):
    """Overwrites the run's training files with zeros once it is built: a run that reads them after that
    fails on a corrupt record; one that trains from the decoded cache never notices."""

    def zero():
        for path in glob.glob(settings["train_data"]):
            with open(path, "r+b") as f:
                f.write(bytes(os.path.getsize(path)))

    return on_line(monkeypatch, STARTING, zero)


def _train(make_config, tmp_path, name, num_towers, micro_batches=4, **loop):
    config = make_config(
        model_dir=tmp_path / name,
        towers={"num_towers": num_towers, "micro_batches": micro_batches},
        loop={"train_steps": STEPS, **loop},
    )
    return train(config)


def _shared(make_config, tmp_path, num_towers, micro_batches=4, train_steps=STEPS) -> dict:
    """The metrics of the plain run of `_train`'s settings (no other loop setting), trained once per module, and
    its directory (`model_dir`, in the tmp_path of the test that trained it): several tests hold their runs
    against the same one (its weights do not depend on its model_dir)."""
    key = (num_towers, micro_batches, train_steps)
    if key not in _SHARED:
        name = f"shared-n{num_towers}-k{micro_batches}-s{train_steps}"
        trained = _train(make_config, tmp_path, name, num_towers, micro_batches, train_steps=train_steps)
        _SHARED[key] = {**trained, "model_dir": tmp_path / name}
    return _SHARED[key]


def _computed(model_dir) -> dict:
    """metrics.json as written, less its layout and timing entries."""
    with open(os.path.join(model_dir, "metrics.json")) as f:
        return computed(json.load(f))


@pytest.mark.quick
def test_rerun_and_tower_counts_give_identical_weights(make_config, tmp_path):
    """cnn has BatchNorm and Dropout: the hardest case for tower-count invariance. The eval figures are the
    same bits too (each eval batch cut into the K parts, not into N), so metrics.json is one file on every
    layout, its timings and devices aside. A rerun of one layout is test_augmented_runs_keep_the_contract's
    (and test_steps_per_call_changes_no_bit's: two 2-tower runs)."""
    initial = _initial_weights(make_config, tmp_path)
    hashes = {n: _train(make_config, tmp_path, f"n{n}", n)["weights_sha256"] for n in (1, 4)}
    two = _shared(make_config, tmp_path, 2)
    assert hashes[1] == two["weights_sha256"] == hashes[4]
    assert two["weights_sha256"] != initial  # the runs trained: equal hashes of untouched weights prove nothing
    assert two["global_step"] == STEPS and two["micro_batches"] == 4
    written = {
        n: _computed(model_dir) for n, model_dir in ((1, tmp_path / "n1"), (2, two["model_dir"]), (4, tmp_path / "n4"))
    }
    eval_figures = {n: {k: v for k, v in w.items() if k.startswith("eval_")} for n, w in written.items()}
    assert eval_figures[1]["eval_examples"] == 360 and isinstance(eval_figures[1]["eval_loss"], float)
    assert sorted(eval_figures[1]) == ["eval_accuracy", "eval_examples", "eval_loss"]
    assert eval_figures[1] == eval_figures[2] == eval_figures[4]  # every figure, exact float equality
    assert written[1] == written[2] == written[4]


def test_seed_changes_the_weights(make_config, tmp_path):
    a = train(make_config(model_dir=tmp_path / "a", seed=1, loop={"train_steps": 3}))
    b = train(make_config(model_dir=tmp_path / "b", seed=2, loop={"train_steps": 3}))
    assert a["weights_sha256"] != b["weights_sha256"]


def test_resume_from_checkpoint_matches_uninterrupted_run(make_config, tmp_path):
    full = _train(make_config, tmp_path, "full", 2, checkpoint_every_steps=STEPS // 2)
    # A run killed after its step-6 checkpoint: only that checkpoint is on disk when it restarts.
    resumed_dir = tmp_path / "resumed" / "checkpoints"
    os.makedirs(resumed_dir)
    for name in os.listdir(tmp_path / "full" / "checkpoints"):
        if name.startswith(f"ckpt-{STEPS // 2}."):
            shutil.copy(tmp_path / "full" / "checkpoints" / name, resumed_dir / name)
    tf.compat.v1.train.update_checkpoint_state(str(resumed_dir), str(resumed_dir / f"ckpt-{STEPS // 2}"))
    resumed = _train(make_config, tmp_path, "resumed", 2, checkpoint_every_steps=STEPS // 2)
    assert resumed["global_step"] == STEPS
    assert resumed["weights_sha256"] == full["weights_sha256"]


@pytest.mark.parametrize("parameter_device", ["/device:CPU:0", "/device:CPU:1", "/device:CPU:3"])
def test_parameter_device_does_not_change_the_result(make_config, tmp_path, monkeypatch, parameter_device):
    """On logical CPU towers --parameter_device=gpu and =cpu both mean /device:CPU:0, so this places the
    variables on other devices explicitly: a tower's (CPU:1), and one that runs no tower (CPU:3)."""
    place, built = devices.place, []

    def placed(config):
        return dataclasses.replace(place(config), parameter_device=parameter_device)

    def recorded(*args, **kwargs):  # the trainer the run builds and trains, to read its variables' devices
        built.append(build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(devices, "place", placed)
    monkeypatch.setattr(run_lib, "build", recorded)
    config = make_config(
        model_dir=tmp_path / "placed", towers={"num_towers": 2, "micro_batches": 4}, loop={"train_steps": 4}
    )
    placed_result = train(config)
    monkeypatch.undo()
    (trainer,) = built
    assert {v.value.device.split("/device:")[1] for v in trainer.model.variables} == {parameter_device[8:]}
    # the reference (1 tower, variables where the run puts them): trained once for the three placements
    assert placed_result["weights_sha256"] == _shared(make_config, tmp_path, 1, train_steps=4)["weights_sha256"]


def test_checkpoints_hold_input_positions_not_shuffle_buffers(make_config, tmp_path):
    """K=2 streams of 32-example micro-batches: after 5 steps each stream is at record 160 of epoch 0 (its
    share of the 1437 digits is 718 or 719 records), and that, not the 10,000-record shuffle buffer, is saved."""
    config = make_config(
        towers={"micro_batches": 2},
        data={"shuffle_buffer": 10_000},
        loop={"train_steps": 5, "checkpoint_every_steps": 5},
    )
    train(config)
    saved = dict(tf.train.list_variables(str(tmp_path / "run" / "checkpoints" / "ckpt-5")))
    assert not [name for name in saved if "ITERATOR_STATE" in name]
    for j in range(2):
        key = f"input_position_{j}/.ATTRIBUTES/VARIABLE_VALUE"
        assert saved[key] == [2]
        assert tf.train.load_variable(str(tmp_path / "run" / "checkpoints" / "ckpt-5"), key).tolist() == [0, 160]


@pytest.mark.quick
def test_resume_across_an_epoch_boundary_is_exact(make_config, tmp_path):
    """Each stream's epoch is ~719 records = ~22 steps of 32: the checkpoint at step 30 sits in epoch 1. The mlp:
    the input positions do not depend on the model, and it traces in half the cnn's time (a quick test)."""
    config = make_config(
        model={"name": "mlp"}, towers={"micro_batches": 2}, loop={"train_steps": 36, "checkpoint_every_steps": 30}
    )
    reference = train(dataclasses.replace(config, loop=dataclasses.replace(config.loop, model_dir=str(tmp_path / "a"))))
    saved, killed = tmp_path / "a" / "checkpoints", tmp_path / "b" / "checkpoints"
    position = tf.train.load_variable(str(saved / "ckpt-30"), "input_position_0/.ATTRIBUTES/VARIABLE_VALUE")
    assert position[0] == 1  # the second epoch
    os.makedirs(killed)  # a run killed after its step-30 checkpoint
    for name in os.listdir(saved):
        if name.startswith("ckpt-30."):
            shutil.copy(saved / name, killed / name)
    tf.compat.v1.train.update_checkpoint_state(str(killed), str(killed / "ckpt-30"))
    resumed = train(dataclasses.replace(config, loop=dataclasses.replace(config.loop, model_dir=str(tmp_path / "b"))))
    assert resumed["weights_sha256"] == reference["weights_sha256"]


def _copy_checkpoint(source, target, step):
    """A run killed after its step-`step` checkpoint: only that checkpoint is on disk when it restarts."""
    os.makedirs(target)
    for name in os.listdir(source):
        if name.startswith(f"ckpt-{step}."):
            shutil.copy(source / name, target / name)
    tf.compat.v1.train.update_checkpoint_state(str(target), str(target / f"ckpt-{step}"))


@pytest.mark.parametrize("cache", ["none", "memory"])
def test_augmented_runs_keep_the_contract(make_config, tmp_path, monkeypatch, cache):
    """--augment=flip forced on cnn-digits: N = 1, 2, 4 at K = 4, a rerun and a kill + resume all give the
    same weights with the decoded cache; the rerun reads no file once built: its files are zeroed then (without
    the cache that run fails on a corrupt record). Without it, N = 2, 4 and the kill + resume: the stream that
    reads the files resumes at its position, and flips the same images on any layout. (N = 1 and a rerun there
    too trained two more runs that tested no more: the K = 4 streams, so their flipped images, are the same
    at every N, and N = 1's step is the cached case's and test_rerun_and_tower_counts_...'s.)"""

    def augmented(name, n, own=None, **loop):
        config = make_config(
            model_dir=tmp_path / name,
            data={"augment": "flip", "cache": cache, **(own or {})},
            towers={"num_towers": n, "micro_batches": 4},
            loop={"train_steps": STEPS, **loop},
        )
        metrics = train(config)
        assert metrics["augment"] == "flip" and metrics["cache"] == cache
        return metrics["weights_sha256"]

    plain = _shared(make_config, tmp_path, 2)["weights_sha256"]  # test_rerun_and_tower_counts' 2-tower run
    towers = (1, 2, 4) if cache == "memory" else (2, 4)
    hashes = {n: augmented(f"n{n}", n, checkpoint_every_steps=STEPS // 2) for n in towers}
    _copy_checkpoint(tmp_path / "n2", tmp_path / "resumed", STEPS // 2)
    resumed = augmented("resumed", 2, checkpoint_every_steps=STEPS // 2)
    assert set(hashes.values()) == {resumed}
    if cache == "memory":
        own = _own_digits(tmp_path, "own")
        zeroed = _zero_once_started(monkeypatch, own)
        assert augmented("n4-again", 4, own) == resumed
        assert zeroed.fired
    assert resumed != plain  # the flips changed what was trained
    assert resumed != _initial_weights(make_config, tmp_path)  # and something was trained


def test_cache_does_not_change_the_weights(make_config, tmp_path, monkeypatch):
    """crop_flip (pad 1 on the 8x8 digits) through an epoch boundary (~22 steps of 32 per stream). The cached
    run's files are zeroed once it is built: it reads none in either epoch, the uncached run reads them all."""

    def run(cache, own=None):
        config = make_config(
            model_dir=tmp_path / cache,
            data={"augment": "crop_flip", "cache": cache, **(own or {})},
            towers={"micro_batches": 2},
            loop={"train_steps": 30},
        )
        metrics = train(config)
        assert metrics["cache"] == cache and metrics["global_step"] == 30
        return metrics["weights_sha256"]

    uncached = run("none")
    own = _own_digits(tmp_path, "own")
    zeroed = _zero_once_started(monkeypatch, own)
    cached = run("memory", own)
    assert zeroed.fired
    assert cached == uncached
    assert cached != _initial_weights(make_config, tmp_path)  # equal hashes of untouched weights prove nothing


def test_steps_per_call_changes_no_bit(make_config, tmp_path, monkeypatch):
    """Several steps per tf.function call (an in-graph loop) give the weights and the logged metrics of one
    step per call, for fixed sizes that cut windows unevenly, auto, and other tower counts."""
    from trainer.step.sync.sync_update import SyncUpdate

    sizes = []  # steps each in-graph loop call ran
    original = SyncUpdate._loop_call

    def recorded(self, remaining, totals, traced, time_last):
        ran, totals, last = original(self, remaining, totals, traced, time_last)
        sizes.append(ran)
        return ran, totals, last

    monkeypatch.setattr(SyncUpdate, "_loop_call", recorded)
    results = {}
    for steps_per_call, towers in ((1, 2), (3, 1), (0, 2), (100, 4)):
        sizes.clear()
        name = f"spc{steps_per_call}-n{towers}"
        results[name] = _train(make_config, tmp_path, name, towers, steps_per_call=steps_per_call, log_every_steps=5)
        # windows of 1, 4, 5 and 2 steps: every step runs in the in-graph loop, a window of 5 in one call of 5
        # (auto: once a step time is known, calls of ~0.5 s; these steps take well under 0.1 s)
        assert sum(sizes) == STEPS
        assert max(sizes) == {1: 1, 3: 3, 0: 5, 100: 5}[steps_per_call]
    values = {(r["weights_sha256"], r["train_loss"], r["train_accuracy"]) for r in results.values()}
    assert len(values) == 1, results
