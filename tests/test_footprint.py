"""A batch that cannot fit is refused before the first step, with the estimate: exit 2, one line, in seconds
(it was a traceback after 27 s that did not say memory)."""

import os
import subprocess
import sys
import time

import keras
import pytest

from trainer.step import footprint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.quick
def test_activations_are_every_layer_output_per_example():
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16)(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.ReLU()(hidden)))
    assert footprint.activation_bytes_per_example(model) == 4 * (8 + 16 + 16 + 3)  # input, dense, relu, logits


@pytest.mark.quick
def test_a_batch_that_cannot_fit_is_refused_with_the_estimate(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "--device=cpu", "--global_batch_size=10000000", f"--model_dir={tmp_path}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("error: --global_batch_size=10000000 does not fit: a step needs at least ~")
    assert " GB available; lower --global_batch_size or raise --micro_batches" in lines[0]
    assert elapsed < 20, elapsed  # TensorFlow's import and the model; no input pipeline, no graph
    assert not (tmp_path / "checkpoints").exists()
