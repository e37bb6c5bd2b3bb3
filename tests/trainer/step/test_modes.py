"""The update-mode interface (`trainer.step.modes`): each mode's checks, input layout, optimizer, records and
resume rules, and one `StepResult` type from both steppers."""

import dataclasses
import json
import logging
import os
import subprocess
import sys
import types

import pytest

from tests.support.paths import ROOT
from trainer.outputs import rundir
from trainer.outputs.summaries import run_hparams
from trainer.settings import config as cfg
from trainer.step import modes
from trainer.step.stepper import StepResult, Updater


def _async_config(**changes):
    return cfg.RunConfig(**{"towers": cfg.TowerConfig(update_mode="async"), **changes})


def test_every_update_mode_of_the_flag_has_a_mode_and_no_other():
    assert tuple(modes.MODES) == cfg.UPDATE_MODES
    assert [modes.mode_for(name).name for name in cfg.UPDATE_MODES] == list(cfg.UPDATE_MODES)


def test_an_unknown_mode_is_a_config_error_naming_the_flag():
    with pytest.raises(cfg.ConfigError, match=r"^--update_mode \('bogus'\) must be one of \('sync', 'async'\)$"):
        modes.mode_for("bogus")


def test_modes_import_no_tensorflow():
    """The entry point checks settings before TensorFlow is imported (2 s)."""
    code = "import sys, trainer.step.modes; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"deterministic": True},
            "--update_mode=async cannot be --deterministic: async updates land in thread-timing order. "
            "Use --update_mode=sync for bitwise reproducible training.",
        ),
        (
            {"towers": cfg.TowerConfig(update_mode="async", mixed_precision="fp16")},
            "--mixed_precision=fp16 cannot be --update_mode=async: a gradient in flight would be unscaled with the "
            "loss scale of the moment it lands, not the one it was computed with (2x or 0.5x updates). Use "
            "--mixed_precision=bf16 (no loss scaling) with async, or sync with fp16.",
        ),
        (
            {"loop": cfg.LoopConfig(steps_per_call=4)},
            "--steps_per_call (4) is for --update_mode=sync: async towers size their own calls (several updates "
            "each without --max_staleness, one with it). Leave it at 0 with async.",
        ),
    ],
    ids=["deterministic", "fp16", "steps_per_call"],
)
def test_async_check_refuses_what_async_cannot_run_and_sync_accepts_it(changes, message):
    config = _async_config(**changes)
    with pytest.raises(cfg.ConfigError) as refused:
        modes.mode_for("async").check(config)
    assert str(refused.value) == message
    sync = dataclasses.replace(config, towers=dataclasses.replace(config.towers, update_mode="sync"))
    modes.mode_for("sync").check(sync)  # no error


def test_async_check_accepts_bf16_and_the_defaults():
    modes.mode_for("async").check(_async_config(towers=cfg.TowerConfig(update_mode="async", mixed_precision="bf16")))
    modes.mode_for("async").check(_async_config())


def test_input_streams_are_one_per_micro_batch_in_sync_and_one_per_tower_in_async():
    config = cfg.RunConfig(towers=cfg.TowerConfig(num_towers=2, micro_batches=4))
    assert modes.mode_for("sync").stream_towers(config, 2) == [0, 0, 1, 1]
    assert modes.mode_for("async").stream_towers(config, 2) == [0, 1]
    assert modes.mode_for("sync").stream_towers(cfg.RunConfig(towers=cfg.TowerConfig(num_towers=3)), 3) == [0, 1, 2]


def test_max_staleness_is_an_hparam_of_async_runs_only():
    assert "max_staleness" not in run_hparams(modes.settle(cfg.RunConfig()), "cnn")
    plan = modes.settle(cfg.RunConfig(towers=cfg.TowerConfig(update_mode="async", max_staleness=3)))
    assert run_hparams(plan, "cnn")["max_staleness"] == 3
    assert list(run_hparams(plan, "cnn"))[-1] == "max_staleness"  # where it was before the modes had an interface


class _Staleness(Updater):
    """An updater that has applied updates of the given staleness, for `run_metrics`."""

    def __init__(self, staleness):
        self._staleness = staleness

    def train_steps(self, num_steps, want_gradients=False, should_stop=None):
        return StepResult(0)

    def interrupt(self):
        pass

    def close(self):
        pass

    @property
    def steps_finished(self):
        return 0

    @property
    def latest_loss(self):
        return None

    @property
    def staleness_all(self):
        return self._staleness


def test_async_adds_staleness_to_metrics_json_and_sync_its_mirrored_variables():
    config = cfg.RunConfig(towers=cfg.TowerConfig(update_mode="async", max_staleness=2))
    assert modes.mode_for("async").run_metrics(config, _Staleness([0, 1, 2, 0])) == {
        "staleness_mean": 0.75,
        "staleness_max": 2,
        "staleness_updates": 4,
        "max_staleness": 2,
    }
    assert modes.mode_for("async").run_metrics(config, _Staleness([])) == {}  # nothing applied yet
    variables = [types.SimpleNamespace(path="dense1/kernel"), types.SimpleNamespace(path="dense1/bias")]
    synced = types.SimpleNamespace(model=types.SimpleNamespace(trainable_variables=variables))
    synced.mirrors = types.SimpleNamespace(indices=[0])  # sync adds its mirrored variables, no staleness
    synced.runner, synced.last_timings = types.SimpleNamespace(run_metrics=lambda timings: {}), {}
    assert modes.mode_for("sync").run_metrics(cfg.RunConfig(), synced) == {"mirrored_variables": ["dense1/kernel"]}


def test_async_optimizer_scales_the_learning_rate_by_1_over_k_and_lowers_momentum(caplog):
    import tensorflow as tf

    step = tf.Variable(0, dtype=tf.int64)
    optimizer = cfg.OptimizerConfig(name="momentum", learning_rate=0.4, momentum=0.9, schedule="constant")
    towers = cfg.TowerConfig(num_towers=2, micro_batches=4, update_mode="async")
    config = cfg.RunConfig(optimizer=optimizer, towers=towers, deterministic=False)
    with caplog.at_level(logging.WARNING, logger="towerflow"):
        made = modes.mode_for("async").make_optimizer(config, step)
    assert float(made.learning_rate) == pytest.approx(0.1)  # 0.4 / K
    assert made.momentum == pytest.approx(0.8)  # 1 - N (1 - 0.9)
    assert "async: explicit momentum 0.8 instead of 0.9 (N=2 towers add implicit momentum)" in caplog.text
    sync = modes.mode_for("sync").make_optimizer(dataclasses.replace(config, towers=cfg.TowerConfig()), step)
    assert (float(sync.learning_rate), sync.momentum) == (pytest.approx(0.4), pytest.approx(0.9))


def _recorded_run(tmp_path, config):
    """A model_dir holding a checkpoint and the run.json of `config`."""
    os.makedirs(tmp_path / "run" / "checkpoints")
    (tmp_path / "run" / "checkpoints" / "ckpt-2.index").write_bytes(b"")
    (tmp_path / "run" / rundir.RUN_FILE).write_text(json.dumps(rundir.defining_settings(modes.settle(config))))


@pytest.mark.parametrize("update_mode", ["sync", "async"])
def test_a_sync_resume_may_change_num_gpus_and_an_async_one_may_not(make_config, tmp_path, update_mode):
    async_ = update_mode == "async"
    towers = {"num_towers": 2, "micro_batches": 2, "update_mode": update_mode}  # K fixed
    before = make_config(deterministic=not async_, towers=towers)
    _recorded_run(tmp_path, before)
    after = dataclasses.replace(before, towers=dataclasses.replace(before.towers, num_towers=1))
    # async: whatever the order of a sum it never makes (each micro-batch's gradient is applied on its own)
    expected = {"towers.gradient_order"} if async_ else {"towers.num_towers", "towers.num_tasks"}
    assert modes.mode_for(update_mode).resume_may_change == expected
    if not async_:
        rundir.check_resume(modes.settle(after), allow_changes=False)  # K fixed: the same result on any towers
        return
    with pytest.raises(rundir.RunDirError, match=r"\(--num_gpus: 2 -> 1\)"):
        rundir.check_resume(modes.settle(after), allow_changes=False)


def _field_types(result: StepResult) -> dict:
    types = {f.name: type(getattr(result, f.name)) for f in dataclasses.fields(result)}
    types["tower_step_sec"] = {type(v) for v in result.tower_step_sec}
    types["staleness"] = {type(v) for v in result.staleness}
    types["metrics"] = {name: type(v) for name, v in result.metrics.items()}
    return types


@pytest.mark.parametrize("update_mode", ["sync", "async"])
def test_both_steppers_return_a_step_result_of_host_values(make_config, update_mode):
    from trainer.loop.build import build

    config = make_config(
        deterministic=update_mode == "sync", model={"name": "mlp"}, towers={"update_mode": update_mode}
    )
    updater = build(config).updater
    try:
        assert isinstance(updater, Updater) and updater.latest_loss is None
        result = updater.train_steps(3, want_gradients=True)
        assert isinstance(result, StepResult) and result.steps == 3
        types = _field_types(result)
        assert types.pop("gradients") is list and len(result.gradients) == len(updater.model.trainable_variables)
        assert types.pop("staleness") == (set() if update_mode == "sync" else {int})
        assert types == {
            "steps": int,
            "traced_steps": int,
            "traced_sec": float,
            "loss": float,
            "metrics": {"accuracy": float},
            "grad_norm": float,
            "learning_rate": float,
            "tower_step_sec": {float},
        }
        assert len(result.tower_step_sec) == 2 and 0.0 <= result.metrics["accuracy"] <= 1.0
        assert isinstance(updater.latest_loss, float)
        assert updater.examples_per_step * (1 if update_mode == "sync" else 2) == 64
        assert updater.train_steps(2).gradients is None
        assert int(updater.global_step.numpy()) == 5
        added = modes.mode_for(update_mode).run_metrics(config, updater)
        if update_mode == "sync":  # one task: no variable is mirrored
            assert added == {"mirrored_variables": []}
        else:  # the staleness of each of the 5 updates applied
            assert set(added) == {"staleness_mean", "staleness_max", "staleness_updates", "max_staleness"}
            assert added["staleness_updates"] == 5 and added["max_staleness"] == -1
            assert 0 <= added["staleness_mean"] <= added["staleness_max"] <= 4  # of 5 updates, at most 4 others
    finally:
        updater.close()
