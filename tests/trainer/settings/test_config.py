"""Flag validation: bad input fails before TensorFlow starts, with a message naming the flag."""

import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT
from tests.support.runs import run_trainer
from trainer.settings import config as cfg
from trainer.settings.resolve import resolve
from trainer.step.modes import mode_for

pytestmark = pytest.mark.quick  # the development subset: fast, and covers this file's checks


def _towers(**kw):
    return cfg.RunConfig(towers=cfg.TowerConfig(**kw))


@pytest.mark.parametrize(
    "config, message",
    [
        (_towers(num_towers=0), "--num_gpus (0) must be at least 1"),
        (_towers(num_towers=4, micro_batches=6), "--micro_batches (6) must be a multiple of the towers (--num_gpus=4)"),
        (
            _towers(num_towers=2, num_tasks=2, micro_batches=6),
            "--micro_batches (6) must be a multiple of the towers (--num_gpus=2 x 2 tasks)",
        ),
        (_towers(global_batch_size=100, micro_batches=3), "--global_batch_size (100) must be divisible by"),
        (_towers(device="tpu"), "--device ('tpu') must be one of"),
        (cfg.RunConfig(optimizer=cfg.OptimizerConfig(name="rmsprop")), "--optimizer ('rmsprop')"),
        (cfg.RunConfig(optimizer=cfg.OptimizerConfig(learning_rate=0)), "--learning_rate (0) must be positive"),
        (
            cfg.RunConfig(optimizer=cfg.OptimizerConfig(schedule="piecewise", boundaries=(10,), values=(0.1,))),
            "--lr_values needs one more value than --lr_boundaries",
        ),
        (cfg.RunConfig(optimizer=cfg.OptimizerConfig(warmup_steps=5000)), "--warmup_steps (5000)"),
        (cfg.RunConfig(data=cfg.DataConfig(train_data="x/*")), "--num_classes (0) must be given"),
        (cfg.RunConfig(data=cfg.DataConfig(train_data="x/*", num_classes=3)), "--eval_data must be given"),
        (cfg.RunConfig(data=cfg.DataConfig(eval_data="x/*")), "--eval_data needs --train_data"),
        (cfg.RunConfig(loop=cfg.LoopConfig(train_steps=0)), "--train_steps (0) must be at least 1"),
        (cfg.RunConfig(loop=cfg.LoopConfig(train_steps=10, profile_steps=(5, 20))), "--profile_steps (5,20) must"),
        (cfg.RunConfig(loop=cfg.LoopConfig(eval_every_steps=-1)), "--eval_every_steps (-1) must be >= 0"),
        (cfg.RunConfig(loop=cfg.LoopConfig(steps_per_call=-1)), "--steps_per_call (-1) must be >= 0 (0: auto)"),
        (
            cfg.RunConfig(towers=cfg.TowerConfig(update_mode="async"), loop=cfg.LoopConfig(steps_per_call=4)),
            "--steps_per_call (4) is for --update_mode=sync",
        ),
    ],
)
def test_validate_names_the_flag(config, message):
    with pytest.raises(cfg.ConfigError) as info:
        resolve(config)
        mode_for(config.towers.update_mode).check(config)
    assert message in str(info.value)


def test_micro_batch_defaults_to_one_per_tower():
    towers = cfg.TowerConfig(num_towers=4, global_batch_size=128)
    assert (towers.num_micro_batches, towers.micro_batch_size) == (4, 32)
    towers = cfg.TowerConfig(num_towers=2, global_batch_size=128, micro_batches=8)
    assert (towers.num_micro_batches, towers.micro_batch_size) == (8, 16)


def _cli(*args, timeout=120):
    return run_trainer(*args, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=timeout)


def test_cli_rejects_bad_flags_before_importing_tensorflow():
    """Runs `python -m trainer` in-process of a fresh interpreter and reports whether TensorFlow was imported."""
    probe = (
        "import sys\n"
        "from absl import app\n"
        "import trainer.__main__ as entry\n"
        "sys.argv = ['trainer', '--global_batch_size=100', '--micro_batches=3']\n"
        "try:\n"
        "    app.run(entry.main)\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code, 'tensorflow imported:', 'tensorflow' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert "--global_batch_size (100) must be divisible by --micro_batches (3)" in result.stderr
    assert result.stdout.strip() == "exit 2 tensorflow imported: False"


def test_cli_gpu_towers_without_gpus_fail_and_name_device_cpu(tmp_path):
    result = _cli("--num_gpus=2", f"--model_dir={tmp_path}")
    assert result.returncode == 2
    assert "TensorFlow sees 0 GPU(s)" in result.stderr
    assert "--device=cpu" in result.stderr


def test_helpfull_documents_every_public_flag():
    result = _cli("--helpfull", timeout=30)
    public = (
        "num_gpus device parameter_device model train_data eval_data num_classes label_offset global_batch_size "
        "micro_batches train_steps update_mode optimizer learning_rate model_dir seed deterministic "
        "log_every_steps histogram_every_steps checkpoint_every_steps eval_every_steps"
    )
    for name in public.split():
        assert f"--{name}:" in result.stdout or f"--[no]{name}:" in result.stdout, name
    assert "(default: '128')" in result.stdout  # defaults are shown
