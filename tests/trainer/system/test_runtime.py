"""Runtime options reach TensorFlow (read back into metrics.json) and are refused where they cannot apply."""

import json
import os

import pytest

from tests.support.runs import cpu_flags, run_trainer
from trainer.settings import config as cfg
from trainer.settings.resolve import resolve
from trainer.system import runtime

SHORT = cpu_flags(num_gpus=None, train_steps=20, export=False, eval_every_steps=0, log_every_steps=10)


def _run(*args, expect=0):
    # what in-process runs of other tests may have set (runtime.apply under --deterministic) must not leak
    env = {k: v for k, v in os.environ.items() if k not in (runtime.ONEDNN_ENV, runtime.AUTOTUNE_ENV)}
    result = run_trainer(*args, env={**env, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == expect, result.stderr[-3000:]
    return result


def _metrics(model_dir) -> dict:
    with open(os.path.join(model_dir, "metrics.json")) as f:
        return json.load(f)


def test_settings_are_read_back_into_metrics(tmp_path):
    flags = ("--inter_op_threads=2", "--intra_op_threads=1", "--onednn=off", "--grappler=layout_optimizer=off")
    _run(*SHORT, *flags, f"--model_dir={tmp_path}")
    got = _metrics(tmp_path)["runtime"]
    assert got["inter_op_threads"] == 2 and got["intra_op_threads"] == 1
    assert got["TF_ENABLE_ONEDNN_OPTS"] == "0" and got["onednn_enabled"] is False
    assert got["grappler"]["layout_optimizer"] is False
    assert got["TF_CUDNN_USE_AUTOTUNE"] is None  # auto, not --deterministic: TensorFlow's default
    recorded = (tmp_path / "flags.txt").read_text().splitlines()
    assert {"--inter_op_threads=2", "--onednn=off", "--grappler=layout_optimizer=off"} <= set(recorded)


def test_onednn_on_and_off_train_the_same_loss(tmp_path):
    losses = {}
    for switch in ("on", "off"):
        model_dir = tmp_path / switch
        _run(*SHORT, "--deterministic", f"--onednn={switch}", f"--model_dir={model_dir}")
        metrics = _metrics(model_dir)
        assert metrics["runtime"]["onednn_enabled"] is (switch == "on")
        losses[switch] = metrics["train_loss"]
    print(f"train_loss after 20 steps: oneDNN on {losses['on']:.6f}, off {losses['off']:.6f}")
    assert losses["on"] == pytest.approx(losses["off"], abs=1e-3)


@pytest.mark.parametrize(
    "args, message",
    [
        (("--gpu_memory_growth",), "--gpu_memory_growth cannot apply with --device=cpu"),
        (("--gpu_memory_limit_mb=1024",), "--gpu_memory_limit_mb cannot apply with --device=cpu"),
        (("--cudnn_autotune=on", "--deterministic"), "--cudnn_autotune=on cannot be --deterministic"),
        (("--grappler=layout_optimiser=off",), "unknown option 'layout_optimiser'; TensorFlow accepts layout_"),
    ],
)
def test_refused_before_tensorflow_starts(tmp_path, args, message):
    result = _run(*SHORT, *args, f"--model_dir={tmp_path}", expect=2)
    assert message in result.stderr
    assert not os.path.exists(tmp_path / "flags.txt")


@pytest.mark.parametrize(
    "runtime_config, deterministic, message",
    [
        (cfg.RuntimeConfig(gpu_memory_growth=True, gpu_memory_limit_mb=512), False, "cannot be combined"),
        (cfg.RuntimeConfig(grappler="remapping=maybe"), False, "must be NAME=on or NAME=off"),
        (cfg.RuntimeConfig(grappler="arithmetic_optimization=on"), True, "cannot be --deterministic"),
        (cfg.RuntimeConfig(inter_op_threads=-1), False, "--inter_op_threads (-1) must be >= 0"),
    ],
)
def test_config_refuses(runtime_config, deterministic, message):
    config = cfg.RunConfig(towers=cfg.TowerConfig(device="gpu"), runtime=runtime_config, deterministic=deterministic)
    with pytest.raises(cfg.ConfigError) as e:
        resolve(config)
    assert message in str(e.value)


def test_environment_before_import():
    assert runtime.environment(cfg.RuntimeConfig(), deterministic=False) == {}
    assert runtime.environment(cfg.RuntimeConfig(), deterministic=True) == {"TF_CUDNN_USE_AUTOTUNE": "0"}
    on = cfg.RuntimeConfig(onednn="on", cudnn_autotune="on")
    assert runtime.environment(on, False) == {"TF_ENABLE_ONEDNN_OPTS": "1", "TF_CUDNN_USE_AUTOTUNE": "1"}
    assert cfg.grappler_options("layout_optimizer=off,remapping=on") == {"layout_optimizer": False, "remapping": True}


def test_a_change_after_device_start_is_refused_clearly():
    import tensorflow as tf

    tf.constant(1.0) + 1.0  # the devices are up (conftest configured them)
    runtime.apply(cfg.RuntimeConfig(), deterministic=True)  # defaults: nothing to change, no error
    current = tf.config.threading.get_intra_op_parallelism_threads()
    with pytest.raises(cfg.ConfigError, match="--intra_op_threads=.* cannot be applied: TensorFlow's devices are"):
        runtime.apply(cfg.RuntimeConfig(intra_op_threads=current + 3), deterministic=False)


def test_tensorflow_imports_without_the_optional_packages_which_import_after_it():
    """IPython and SciPy (installed here: CI's image and most research environments have them) stay out of
    TensorFlow's and Keras's import, and a user's code imports them afterwards as usual."""
    import importlib.util
    import subprocess
    import sys

    from tests.support.paths import ROOT

    missing = [name for name in ("IPython", "scipy") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"not installed: {missing}")
    code = (
        "import sys\n"
        "from trainer.system import runtime\n"
        "with runtime.without_optional_packages():\n"
        "    import tensorflow, keras\n"
        "print(sorted(n for n in runtime.OPTIONAL_PACKAGES if n in sys.modules))\n"
        "import IPython, scipy.sparse\n"
        "print(sorted(n for n in ('IPython', 'scipy') if sys.modules.get(n) is not None))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["[]", "['IPython', 'scipy']"]
