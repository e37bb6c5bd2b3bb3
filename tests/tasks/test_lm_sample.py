"""`python -m tasks.sample` and the language model's served signatures, on a small exported run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tasks import sample
from tasks.lm import LanguageModel
from tests.support.lm_config import lm_config as _config
from tests.support.paths import ROOT


def _export_run(run_dir, task, model, step=12):
    """What the engine leaves: export/<step>/ with the task's signatures, run.json with describe() as `task.*`."""
    module = tf.Module()
    module.model = model
    signatures = {
        name: tf.function(fn, input_signature=specs).get_concrete_function()
        for name, (fn, specs) in task.serving(model).items()
    }
    tf.saved_model.save(module, str(run_dir / "export" / str(step)), signatures=signatures)
    facts = {f"task.{key}": value for key, value in task.describe().items()}  # as rundir.check_resume writes them
    (run_dir / "run.json").write_text(json.dumps({"seed": 0, **facts}))


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory):
    data_dir, run_dir = tmp_path_factory.mktemp("data"), tmp_path_factory.mktemp("run")
    task = LanguageModel(_config(data_dir, chars=list("\n abcdefgh"), context=6))
    keras.utils.set_random_seed(0)
    model = task.build_model()
    _export_run(run_dir, task, model)
    return run_dir, model


def test_served_logits_are_the_models(exported_run):
    run_dir, model = exported_run
    loaded = tf.saved_model.load(str(run_dir / "export" / "12"))
    ids = tf.constant([[1, 2, 3, 4], [5, 6, 0, 0]], tf.int32)
    lengths = tf.constant([4, 2], tf.int32)
    full = loaded.signatures["serving_default"](tokens=ids)["logits"].numpy()
    np.testing.assert_allclose(full, model(ids).numpy(), rtol=1e-6, atol=1e-6)
    last = loaded.signatures["next_token"](tokens=ids, lengths=lengths)["logits"].numpy()
    np.testing.assert_allclose(last, model((ids, lengths)).numpy()[[0, 1], [3, 1]], rtol=1e-6, atol=1e-6)


def _sample(run_dir, *args):
    """`python -m tasks.sample` as a user's shell starts it (no TF_CPP_MIN_LOG_LEVEL)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"} | {"PYTHONPATH": ROOT}
    command = [sys.executable, "-m", "tasks.sample", str(run_dir), "--tokens=30", *args]
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_sampler_is_seeded(exported_run):
    run_dir, _ = exported_run
    first, again, other = (_sample(run_dir, "--prompt=ab", f"--seed={s}") for s in (1, 1, 2))
    assert [r.returncode for r in (first, again, other)] == [0, 0, 0], first.stderr
    assert [r.stderr for r in (first, again, other)] == ["", "", ""]  # no TensorFlow start-up line (cuInit, ...)
    assert first.stdout == again.stdout and first.stdout != other.stdout
    assert first.stdout.startswith("ab") and len(first.stdout) == 2 + 30 + 1  # prompt, tokens, newline
    assert set(first.stdout[:-1]) <= set("\n abcdefgh")


@pytest.mark.quick
def test_sampler_top_k_one_is_greedy(exported_run):
    run_dir, model = exported_run
    task = sample.read_vocabulary(str(run_dir))
    loaded = tf.saved_model.load(sample.newest_export(str(run_dir)))
    ids = sample.sample(loaded.signatures["next_token"], [3, 4], 8, task["context"], 5, 1.0, top_k=1)
    greedy = [3, 4]
    for _ in range(8):
        window = np.array([greedy[-6:]], np.int32)
        greedy.append(int(model(window).numpy()[0, -1].argmax()))
    assert ids == greedy


@pytest.mark.quick
@pytest.mark.parametrize("tokens", ["-1", "100001"])
def test_sampler_tokens_out_of_bounds_is_one_line(tmp_path, capsys, tokens):
    assert sample.main([str(tmp_path), f"--tokens={tokens}"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: --tokens ({tokens}) must be between 0 and 100000 (each token runs the model over its whole window: "
        "about half an hour for the default model on 2 CPU cores); sample again with another --seed for more\n"
    )


@pytest.mark.quick
@pytest.mark.parametrize("tokens", ["byte", "char"])
def test_the_sampler_streams_whole_characters_and_prints_what_decode_makes(tokens):
    """Byte by byte, a character is printed once it is whole; the pieces, joined, are `decode` of every id,
    broken UTF-8 included (U+FFFD as one decode makes it)."""
    text = "naïve “text” ✓ 𝄞".encode()
    rng = np.random.default_rng(0)
    cases = [list(text), *[rng.integers(0, 256, 40).tolist() for _ in range(200)]]
    task = {"tokens": "byte"}
    if tokens == "char":
        task, cases = {"tokens": "char", "vocab": list("abc ✓")}, [rng.integers(0, 5, 40).tolist()]
    for ids in cases:
        decoder = sample.Decoder(task)
        pieces = [decoder.add(i) for i in ids] + [decoder.end()]
        assert "".join(pieces) == sample.decode(ids, task)
    if tokens == "byte":
        decoder = sample.Decoder(task)
        assert [decoder.add(b) for b in "✓a".encode()] == ["", "", "✓", "a"]  # 3 bytes, then a whole character


@pytest.mark.quick
@pytest.mark.parametrize(
    "case, message",
    [
        ("no_dir", "does not exist"),
        ("no_export", "has no export/<step>/ SavedModel"),
        ("no_task", "no task.tokens, task.vocab and task.context"),
        ("bad_prompt", "--prompt has characters the vocabulary lacks: 'z'"),
    ],
)
def test_sampler_bad_run_dir_is_one_line(tmp_path, capsys, exported_run, case, message):
    run_dir = {"no_dir": tmp_path / "absent", "bad_prompt": exported_run[0]}.get(case, tmp_path)
    if case == "no_task":
        (tmp_path / "export" / "3").mkdir(parents=True)
        (tmp_path / "run.json").write_text(json.dumps({"seed": 0}))
    assert sample.main([str(run_dir), "--prompt=az"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
