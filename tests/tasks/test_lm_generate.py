"""The language model's `generate` signature (tasks/lm_generate.py) and its key/value cache
(`transformer_lm.cached_call`): the cache computes the full call's logits, greedy decoding with it is the full
calls' arg-max token for token, draws and decoding are `python -m tasks.sample`'s (a fresh process with only
TensorFlow, and tensorflow_text for subword tokens, prints the sampler's text), and bad inputs are refused
naming the problem."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.transformer import transformer_lm
from tasks import lm_generate, sample
from tests.support.runs import trained_lm_run

# Its tests share the char run and, with test_lm_subword.py, the session's subword run: on one xdist worker these are
# made once, not once per worker
pytestmark = pytest.mark.xdist_group("subword_lm_run")

CHARS = list("\n abcdefgh")
CONTEXT = 8


def _model(positions: str, vocab: int = len(CHARS)):
    keras.utils.set_random_seed(0)
    return transformer_lm(vocab, layers=2, heads=2, width=16, context=CONTEXT, positions=positions)


@functools.cache
def _generator(positions: str, tokens: str = "char"):
    """(model, the traced `generate` of a tiny untrained model), as the export traces it."""
    if tokens == "byte":
        model, tokenizer = _model(positions, vocab=256), lm_generate.ByteTokens()
    else:
        model, tokenizer = _model(positions), lm_generate.CharTokens(CHARS)
    function, specs = lm_generate.Generator(model, tokenizer).generate, lm_generate.SPECS
    return model, tf.function(function, input_signature=specs, autograph=False)


def _call(generate, prompt, count, seed=0, temperature=0.0, top_k=0) -> tuple[str, list[int]]:
    out = generate(
        tf.constant(prompt),
        tf.constant(count),
        tf.constant(seed, tf.int64),
        tf.constant(temperature),
        tf.constant(top_k),
    )
    return out["text"].numpy().decode("utf-8"), out["tokens"].numpy().tolist()


def _next_token(model):
    """The export's `next_token`, in process: logits [1, vocab] at each last real token."""

    def next_token(tokens, lengths):
        return {"logits": tf.gather(model((tokens, lengths)), lengths - 1, batch_dims=1)}

    return next_token


@pytest.mark.quick
@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_cached_call_gives_the_full_calls_logits(positions):
    model = _model(positions)
    ids = np.random.default_rng(1).integers(0, len(CHARS), size=(1, CONTEXT)).astype(np.int32)
    logits, cache = model.cached_call(ids[:, :3], 0, model.empty_cache(1))  # the prefill: positions 0, 1, 2
    cached = list(logits.numpy()[0])
    for position in range(3, CONTEXT):
        logits, cache = model.cached_call(ids[:, position : position + 1], position, cache)
        cached.append(logits.numpy()[0, 0])
    full = [model(ids[:, : t + 1]).numpy()[0, t] for t in range(CONTEXT)]  # each prefix, as next_token sees it
    np.testing.assert_allclose(np.array(cached), np.array(full), rtol=0, atol=1e-5)  # float32 rounding, no more
    assert len(cache) == 2 and cache[0][0].shape == (1, 2, CONTEXT, 8)


@pytest.mark.parametrize("positions", ["learned", "rotary"])  # not quick: 4.5 s of tracing each
def test_greedy_generate_is_the_full_calls_argmax(positions):
    """14 new tokens after 2: past the context (8), where the window slides and each step runs it whole."""
    model, generate = _generator(positions)
    text, ids = _call(generate, "ab", 14, temperature=0.0)
    greedy = [CHARS.index("a"), CHARS.index("b")]
    for _ in range(14):
        window = np.array([greedy[-CONTEXT:]], np.int32)
        greedy.append(int(model(window).numpy()[0, -1].argmax()))
    assert ids == greedy and text == "".join(CHARS[i] for i in greedy)
    assert len(set(greedy[2:])) > 1  # not one token repeated: the test would hold for a constant model


@pytest.mark.parametrize("temperature, top_k", [(1.0, 0), (0.7, 40)])
def test_byte_draws_and_decoding_are_the_samplers(temperature, top_k):
    """An untrained byte model draws bytes that are rarely whole UTF-8 characters: each becomes U+FFFD as
    tasks.sample's decode makes it."""
    model, generate = _generator("rotary", tokens="byte")
    text, ids = _call(generate, "né ", 20, seed=4, temperature=temperature, top_k=top_k)
    prompt = list("né ".encode())
    expected = sample.sample(_next_token(model), prompt, 20, CONTEXT, 4, temperature, top_k)
    assert ids == expected and text == sample.decode(expected, {"tokens": "byte"})
    assert text.startswith("né ") and "\ufffd" in text


@pytest.mark.quick
@pytest.mark.parametrize(
    "prompt, count, top_k, message",
    [
        ("azy", 3, 0, "generate: the prompt has characters the vocabulary lacks:] [zy]"),
        ("ab", -1, 0, "generate: max_new_tokens must be >= 0"),
        ("ab", 3, -2, "generate: top_k must be >= 0"),
        ("", 3, 0, "generate: the prompt is empty"),
    ],
)
def test_bad_inputs_are_refused_naming_the_problem(prompt, count, top_k, message):
    _, generate = _generator("learned")
    with pytest.raises(tf.errors.InvalidArgumentError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _call(generate, prompt, count, temperature=1.0, top_k=top_k)


# A fresh process, on the export of a short trained run, against `python -m tasks.sample`.

FRESH = r"""
import json, sys
import tensorflow as tf
if sys.argv[2] == "subword":
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
towerflow = {"trainer", "tasks", "models", "data", "launch"}
assert not towerflow & {name.split(".")[0] for name in sys.modules}, "the export needs no towerflow module"
generate = tf.saved_model.load(sys.argv[1]).signatures["generate"]
texts = []
for prompt, count, seed, temperature, top_k in json.loads(sys.argv[3]):
    out = generate(prompt=tf.constant(prompt), max_new_tokens=tf.constant(count, tf.int32),
                   seed=tf.constant(seed, tf.int64), temperature=tf.constant(temperature, tf.float32),
                   top_k=tf.constant(top_k, tf.int32))
    texts.append(out["text"].numpy().decode("utf-8"))
print(json.dumps(texts))
"""

# (prompt, new tokens, seed, temperature, top_k): 4 + 40 tokens pass the context (32); temperature 0 is greedy.
CASES = [("The ", 40, 3, 0.8, 5), ("def ", 12, 0, 0.0, 0)]


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    """Char records of the default corpus's first 20,000 characters and a run of 2 steps with its export."""
    return trained_lm_run(tmp_path_factory.mktemp("generate_char"), "char", chars=20_000, steps=2, batch=8) / "run"


@pytest.fixture(scope="module")
def subword_run(subword_lm_run):
    return subword_lm_run / "run"  # tests/tasks/conftest.py: test_lm_subword's run


@pytest.mark.xdist_group("subword_lm_run")  # test_lm_subword's: the session's subword run made once
@pytest.mark.parametrize("tokens", ["char", "subword"])
def test_a_fresh_process_generates_the_samplers_text(tokens, request, capsys):
    run_dir = request.getfixturevalue(f"{tokens}_run")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, "-c", FRESH, sample.newest_export(str(run_dir)), tokens, json.dumps(CASES)]
    done = subprocess.run(command, cwd=run_dir, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    generated = json.loads(done.stdout)
    for (prompt, count, seed, temperature, top_k), text in zip(CASES, generated, strict=True):
        flags = [f"--prompt={prompt}", f"--tokens={count}", f"--seed={seed}"]
        flags += ["--top_k=1"] if temperature <= 0 else [f"--temperature={temperature}", f"--top_k={top_k}"]
        assert sample.main([str(run_dir), *flags]) == 0  # greedy: the sampler's top_k 1
        assert text + "\n" == capsys.readouterr().out and text.startswith(prompt)
