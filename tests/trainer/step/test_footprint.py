"""A batch that cannot fit is refused before the first step, with the estimate: exit 2, one line, in seconds
(it was a traceback after 27 s that did not say memory)."""

import os
import time

import keras
import pytest

from tests.support.runs import cpu_flags, run_trainer
from trainer.step.memory import estimate


@pytest.mark.quick
def test_activations_are_every_layer_output_per_example():
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16)(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.ReLU()(hidden)))
    assert estimate.activation_bytes_per_example(model) == 4 * (8 + 16 + 16 + 3)  # input, dense, relu, logits


@pytest.mark.quick
def test_a_batch_that_cannot_fit_is_refused_with_the_estimate(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    started = time.monotonic()
    flags = cpu_flags(num_gpus=None, global_batch_size=10000000)
    result = run_trainer(*flags, f"--model_dir={tmp_path}", env=env, timeout=120)
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("error: --global_batch_size=10000000 does not fit: a step needs at least ~")
    assert " GB available; lower --global_batch_size or raise --micro_batches" in lines[0]
    assert elapsed < 20, elapsed  # TensorFlow's import and the model; no input pipeline, no graph
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.quick
def test_on_gpus_a_stage_is_counted_on_its_own_device_and_on_cpus_a_pipeline_once(monkeypatch):
    """The bound with --pipeline_stages: a GPU holds 1/S of its pipeline's need at least (refused at S=1 under a
    limit S=4 passes), the host keeps one micro-batch's activations per pipeline, not per tower."""
    from trainer.settings import config as cfg

    inputs = keras.Input((1000,))
    model = keras.Model(inputs, keras.layers.Dense(1000)(keras.layers.Dense(1000)(inputs)))
    weights = 4 * 4 * (2 * 1000 * 1000 + 2 * 1000)  # the variables, their gradients and two slots
    activations = 4 * 3000  # input, two Dense outputs, per example

    def config(num_stages, limit_mb, device="gpu"):
        towers = cfg.TowerConfig(num_towers=4, device=device, global_batch_size=64, pipeline_stages=num_stages)
        return cfg.RunConfig(towers=towers, runtime=cfg.RuntimeConfig(gpu_memory_limit_mb=limit_mb))

    need_mb = (activations * 16 + weights) / (1 << 20)  # one micro-batch of 16 at a time on a GPU
    with pytest.raises(cfg.ConfigError, match=r"a step needs at least ~0\.0 GB \(12 KB of activations per"):
        estimate.check_batch_fits(model, config(1, int(need_mb) - 1), (1000,))
    estimate.check_batch_fits(model, config(1, int(need_mb) + 1), (1000,))
    estimate.check_batch_fits(model, config(4, int(need_mb / 4) + 1), (1000,))
    with pytest.raises(cfg.ConfigError, match="16 examples computed at once"):
        estimate.check_batch_fits(model, config(4, int(need_mb / 4) - 1), (1000,))
    monkeypatch.setattr(estimate, "available_bytes", lambda config: 1)  # the host: counted, then refused
    for num_stages, examples in ((1, 64), (2, 32), (4, 16)):  # a micro-batch of 16 per pipeline at once
        with pytest.raises(cfg.ConfigError, match=f" x {examples} examples computed at once"):
            estimate.check_batch_fits(model, config(num_stages, 0, "cpu"), (1000,))
