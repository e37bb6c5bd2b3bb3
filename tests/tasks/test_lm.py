"""Tests of the language model: models/transformer.py, tasks/lm.py (loss and metrics against numpy, vocab.json,
serving) and `python -m tasks.sample`."""

from __future__ import annotations

import json
import math
import os
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from data import DataError
from models.registry import ModelError
from models.transformer import attention_mask, parameter_count, rotary, transformer_lm
from tasks.lm import LanguageModel
from tests.support.lm_config import CHARS
from tests.support.lm_config import lm_config as _config
from trainer.settings import config as cfg


def _model(positions="learned", context=8, vocab=7):
    keras.utils.set_random_seed(0)
    return transformer_lm(vocab, layers=2, heads=2, width=8, context=context, positions=positions)


@pytest.mark.quick
@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_model_is_causal(positions):
    model = _model(positions)
    ids = np.random.default_rng(0).integers(0, 7, (2, 8)).astype(np.int32)
    changed = ids.copy()
    changed[:, 4] = (changed[:, 4] + 1) % 7
    before, after = model(ids).numpy(), model(changed).numpy()
    np.testing.assert_array_equal(before[:, :4], after[:, :4])
    assert np.abs(before[:, 4:] - after[:, 4:]).min(axis=-1).max() > 0  # a later position does see it


@pytest.mark.quick
@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_padding_does_not_change_real_positions(positions):
    model = _model(positions)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 7, (2, 8)).astype(np.int32)
    lengths = np.array([5, 3], np.int32)
    noisy = ids.copy()
    noisy[0, 5:], noisy[1, 3:] = rng.integers(0, 7, 3), rng.integers(0, 7, 5)
    before, after = model((ids, lengths)).numpy(), model((noisy, lengths)).numpy()
    np.testing.assert_array_equal(before[0, :5], after[0, :5])
    np.testing.assert_array_equal(before[1, :3], after[1, :3])
    # Causality alone hides padding at the end from real positions; the lengths also hide a padding key from a
    # later padding query: changing token 6 of row 0 (length 5) leaves position 7 alone only with the lengths.
    moved = ids.copy()
    moved[0, 6] = (moved[0, 6] + 1) % 7
    np.testing.assert_array_equal(model((ids, lengths)).numpy()[0, 7], model((moved, lengths)).numpy()[0, 7])
    assert not np.array_equal(model(ids).numpy()[0, 7], model(moved).numpy()[0, 7])


@pytest.mark.quick
@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_positions_are_seen(positions):
    """One causal attention layer alone is blind to the order of what it sees (two layers are not: causality
    tells them apart): swapping the first two tokens would leave the last position's logits as they were. The
    positions (learned, or rotary inside attention) must move them."""
    keras.utils.set_random_seed(0)
    model = transformer_lm(7, layers=1, heads=2, width=8, context=8, positions=positions)
    ids, swapped = np.array([[1, 2, 3]], np.int32), np.array([[2, 1, 3]], np.int32)
    assert np.abs(model(ids).numpy()[0, 2] - model(swapped).numpy()[0, 2]).max() > 1e-4


@pytest.mark.quick
def test_rotary_scores_depend_on_the_offset_only():
    rng = np.random.default_rng(4)
    q, k = (np.repeat(rng.normal(size=(1, 1, 1, 8)), 6, axis=2).astype(np.float32) for _ in range(2))
    rq, rk = rotary(q).numpy()[0, 0], rotary(k).numpy()[0, 0]  # the same vectors at positions 0..5
    np.testing.assert_allclose(rq[3] @ rk[1], rq[5] @ rk[3], rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(rq, axis=-1), np.linalg.norm(q[0, 0], axis=-1), rtol=1e-5)
    assert abs(rq[3] @ rk[1] - rq[3] @ rk[2]) > 1e-3
    np.testing.assert_array_equal(rq[0], q[0, 0, 0])  # position 0 is not turned


@pytest.mark.quick
def test_attention_mask_exact():
    mask = attention_mask(4, np.array([3, 1], np.int32))
    causal = np.tril(np.ones((4, 4), bool))
    np.testing.assert_array_equal(mask.numpy()[:, 0], [causal & [1, 1, 1, 0], causal & [1, 0, 0, 0]])
    np.testing.assert_array_equal(attention_mask(4).numpy()[0, 0], causal)


@pytest.mark.quick
@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_any_length_up_to_context(positions):
    model = _model(positions)
    ids = np.random.default_rng(2).integers(0, 7, (3, 8)).astype(np.int32)
    full = model(ids).numpy()
    call = tf.function(lambda x: model(x), input_signature=[tf.TensorSpec([None, None], tf.int32)])
    for length in (1, 3, 8):
        np.testing.assert_allclose(call(ids[:, :length]).numpy(), full[:, :length], rtol=1e-5, atol=1e-6)
    assert call(ids[:, :5]).shape == (3, 5, 7) and call(ids).dtype == tf.float32
    with pytest.raises(ModelError, match="9 tokens exceed the context"):
        model(np.zeros((1, 9), np.int32))


@pytest.mark.quick
@pytest.mark.parametrize(
    "vocab, layers, heads, width, context, positions",
    [
        (7, 2, 2, 8, 8, "learned"),
        (65, 4, 4, 128, 64, "learned"),
        (256, 3, 2, 16, 32, "rotary"),
    ],
)
def test_parameter_count(vocab, layers, heads, width, context, positions):
    model = transformer_lm(vocab, layers, heads, width, context, positions)
    assert model.count_params() == parameter_count(vocab, layers, width, context, positions)


def test_parameter_count_at_gpt2_smalls_depth():
    """gpt2-small's 12 layers and heads at a small width (not quick: 12 blocks take ~3 s to build)."""
    assert transformer_lm(11, 12, 12, 48, 16, "learned").count_params() == parameter_count(11, 12, 48, 16, "learned")


@pytest.mark.quick
def test_parameter_count_of_the_default_model():
    # V*W + C*W + L*(12 W^2 + 13 W) + 2W + W*V for V=65, W=128, C=64, L=4: nanoGPT's layout, untied head.
    assert parameter_count(65, 4, 128, 64, "learned") == 65 * 128 * 2 + 64 * 128 + 4 * (12 * 128**2 + 13 * 128) + 256


@pytest.mark.quick
@pytest.mark.parametrize("vocab, count", [(32_000, 134_994_432), (50_257, 163_037_184)])
def test_parameter_count_of_the_gpt2_small_preset(vocab, count):
    """--lm_preset=gpt2-small's sizes; the head is untied, so GPT-2 small's 124,439,808 (50,257 tokens, head
    tied to the embedding) plus one more vocab x width matrix."""
    from tasks.lm_options import PRESETS  # noqa: PLC0415

    shape = PRESETS["gpt2-small"]
    assert (shape["layers"], shape["heads"], shape["width"], shape["context"]) == (12, 12, 768, 1024)
    assert parameter_count(vocab, shape["layers"], shape["width"], shape["context"], "learned") == count
    if vocab == 50_257:
        assert count - vocab * 768 == 124_439_808


@pytest.mark.quick
def test_mixed_precision_logits_are_float32():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _model("rotary")
        assert model.blocks[0].attention.query.compute_dtype == "float16"
        assert model(np.zeros((2, 4), np.int32)).dtype == tf.float32
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.quick
@pytest.mark.parametrize("bad", [{"heads": 3}, {"positions": "sinusoid"}, {"layers": 0}, {"dropout": 1.0}])
def test_bad_sizes_are_one_line(bad):
    sizes = {"vocab_size": 7, "layers": 1, "heads": 2, "width": 8, "context": 4, **bad}
    with pytest.raises(ModelError, match="transformer_lm: "):
        transformer_lm(**sizes)


# The task.


def _batch():
    tokens = np.array([[2, 4, 5, 6, 1], [3, 6, 0, 0, 0], [4, 4, 4, 4, 0]], np.int32)
    return {"tokens": tf.constant(tokens), "tokens_length": tf.constant([5, 2, 4], np.int32)}


def _reference(logits, batch):
    """numpy (float64): per-token cross-entropy, weights, bits and bytes and hits over real targets."""
    tokens, lengths = batch["tokens"].numpy(), batch["tokens_length"].numpy()
    targets = tokens[:, 1:]
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    losses = -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    weights = (np.arange(targets.shape[1])[None] < (lengths - 1)[:, None]).astype(np.float32)
    nbytes = np.array([len(c.encode()) for c in CHARS])[targets]
    hits = logits.argmax(axis=-1) == targets
    return losses, weights, (losses * weights).sum() / math.log(2), (nbytes * weights).sum(), (hits * weights).sum()


@pytest.mark.quick
def test_loss_and_metrics_match_numpy(tmp_path):
    task = LanguageModel(_config(tmp_path))
    batch = _batch()
    inputs, lengths = task.model_inputs(batch)
    assert inputs.shape == (3, 4) and lengths.numpy().tolist() == [4, 1, 3]
    logits = np.random.default_rng(3).normal(size=(3, 4, 7)).astype(np.float32) * 3
    losses, weights = task.loss(tf.constant(logits), batch)
    ref_losses, ref_weights, bits, nbytes, hits = _reference(logits, batch)
    np.testing.assert_array_equal(weights.numpy(), ref_weights)
    np.testing.assert_array_equal(ref_weights, [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]])
    np.testing.assert_allclose(losses.numpy(), ref_losses, rtol=2e-7, atol=2e-7)
    metrics = {k: (float(s), float(c)) for k, (s, c) in task.metrics(tf.constant(logits), batch).items()}
    np.testing.assert_allclose(metrics["bits_per_byte"][0], bits, rtol=1e-6)
    # Targets 4 5 6 1 | 6 | 4 4 4 are é € 😀 ' ' | 😀 | é é é: 2+3+4+1 + 4 + 2+2+2 bytes.
    assert metrics["bits_per_byte"][1] == nbytes == 20
    assert metrics["accuracy"] == (hits, 8.0)
    assert task.eval_metrics({"loss": 2.0}) == {"perplexity": math.exp(2.0)}


@pytest.mark.quick
def test_metrics_trace_in_several_functions(tmp_path):
    """The engine traces the metrics once per graph (train, eval, every bucket's shape): nothing a trace makes
    may be kept for the next one."""
    task = LanguageModel(_config(tmp_path))
    logits = tf.zeros((3, 4, 7))
    first = tf.function(lambda x, b: task.metrics(x, b))(logits, _batch())
    second = tf.function(lambda x, b: task.metrics(x, b))(logits, _batch())
    assert float(first["bits_per_byte"][1]) == float(second["bits_per_byte"][1]) == 20.0


@pytest.mark.quick
def test_byte_tokens_count_one_byte_each(tmp_path):
    task = LanguageModel(_config(tmp_path, tokens="byte"))
    logits = tf.zeros((3, 4, 256))
    bits, nbytes = task.metrics(logits, _batch())["bits_per_byte"]
    assert float(nbytes) == 8.0
    np.testing.assert_allclose(float(bits) / float(nbytes), 8.0, rtol=1e-6)  # uniform over 256: 8 bits a byte
    assert task.describe() == {
        "source_sha256": "ab" * 32,
        "tokens": "byte",
        "vocab_size": 256,
        "vocab": None,
        "context": 8,
    }


@pytest.mark.quick
def test_features_preprocess_and_describe(tmp_path):
    task = LanguageModel(_config(tmp_path, context=6))
    feature = task.features()["tokens"]
    assert (feature.dtype, feature.max_length, feature.buckets) == ("int64", 7, (7,))
    assert feature.bounds == (0, 7)  # the vocabulary: an id past it is named in the pipeline, not the embedding
    out = task.preprocess({"tokens": tf.constant([1, 2, 3], tf.int64)}, tf.constant([0, 0]), training=True)
    assert out["tokens"].dtype == tf.int32 and out["tokens"].numpy().tolist() == [1, 2, 3]
    assert task.describe() == {
        "source_sha256": "ab" * 32,
        "tokens": "char",
        "vocab_size": 7,
        "vocab": CHARS,
        "context": 6,
    }
    assert task.build_model().count_params() == parameter_count(7, 1, 8, 6, "learned")


@pytest.mark.quick
@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: os.remove(d / "vocab.json"), "vocab.json: No such file"),
        (lambda d: (d / "vocab.json").write_text("{"), "vocab.json is not JSON"),
        (lambda d: (d / "vocab.json").write_text('{"tokens": "word", "context": 8}'), "lacks a valid"),
        (
            lambda d: (d / "vocab.json").write_text('{"tokens": "byte", "context": 9}'),
            r"written for context 9 \(.*vocab.json\), longer than the model's context 8 \(--lm_context\)",
        ),
    ],
)
def test_bad_vocab_is_one_line_naming_the_file(tmp_path, damage, message):
    task = LanguageModel(_config(tmp_path))
    damage(tmp_path)
    with pytest.raises(DataError, match=message) as info:
        task.vocab_size  # noqa: B018
    assert str(tmp_path / "vocab.json") in str(info.value) and "\n" not in str(info.value)


@pytest.mark.quick
def test_records_of_a_shorter_context_are_read_at_their_length_and_eval_of_another_vocabulary_refused(tmp_path):
    """Records of context 8 under a model of context 32: the feature (and what the memory checks count at) is 9
    tokens, not 33. Eval records beside a vocab.json of other characters: refused naming both files, as `python
    -m trainer` refuses them before TensorFlow (tests/user/test_bad_input.py)."""
    config = _config(tmp_path, context=8)
    config.task.option_dict["context"] = 32
    assert LanguageModel(config).features()["tokens"].max_length == 9
    other = tmp_path / "other"
    other.mkdir()
    (other / "eval-00000-of-00001.tfrecord").write_bytes(b"")
    (other / "vocab.json").write_text(json.dumps({"tokens": "char", "chars": list("xyz"), "context": 8}))
    config.data.eval_data = str(other / "eval-*")
    with pytest.raises(DataError, match="records of different vocabularies") as refused:
        LanguageModel(config).vocab_size  # noqa: B018
    assert f"{tmp_path}/vocab.json says char tokens, 7 characters, {other}/vocab.json says char tokens, 3" in str(
        refused.value
    )


# Serving and the sampler.


@pytest.mark.quick
def test_the_records_check_before_tensorflow_warns_of_a_shorter_context(tmp_path):
    """What `python -m trainer` says before TensorFlow (tasks.check_records, run by trainer/system/preflight.py):
    records of context 8 under --lm_preset=gpt2-small (context 1024) are one warning naming both contexts and
    the flags; the same records' eval beside them, nothing more."""
    import tasks

    _config(tmp_path, context=8)
    glob_ = str(tmp_path / "train-*")
    config = types.SimpleNamespace(
        task=types.SimpleNamespace(name="lm", options=(("preset", "gpt2-small"),)),
        towers=cfg.TowerConfig(),
        data=types.SimpleNamespace(train_data=glob_, eval_data=glob_),
    )
    problem, warnings = tasks.check_records(config)
    assert problem == "" and warnings == [
        f"warning: the records were written for context 8 ({tmp_path}/vocab.json) and the model's context is 1024 "
        "(--lm_context, set by --lm_preset=gpt2-small): it trains on windows of at most 8 tokens, positions past "
        "them never; rewrite the records with `python -m data.prepare text ... --context=1024`, or pass "
        "--lm_context=8"
    ]
