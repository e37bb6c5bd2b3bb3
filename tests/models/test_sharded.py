"""`models.sharded` and the Transformer built in shards: what one device computes of the split layers.

The engine's tests (tests/trainer/step/test_tensor_parallel.py) hold the bits across devices; here, on one
device and eagerly, that the split computes what the whole layers would: the vocabulary-parallel cross-entropy
and arg-max against TensorFlow's on the concatenated logits, the cached generation path against the full call,
and the variables each shard owns.
"""

import numpy as np
import pytest
import tensorflow as tf

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def model():
    import keras

    from models import layout
    from models.transformer import transformer_lm

    keras.utils.set_random_seed(3)
    return layout.split_model(transformer_lm(256, layers=1, heads=4, width=16, context=8), (), 4)


def _ids(batch=3, length=8, seed=0, vocab=256):
    return tf.constant(np.random.RandomState(seed).randint(0, vocab, (batch, length)), tf.int32)


def test_the_logits_come_as_four_vocabulary_shards(model):
    logits = model(_ids())
    assert isinstance(logits, tuple) and [tuple(x.shape) for x in logits] == [(3, 8, 64)] * 4


def test_the_sharded_cross_entropy_and_argmax_are_those_of_the_whole_logits(model):
    from models import vocab_shards

    logits, targets = model(_ids()), _ids(seed=1)
    whole = vocab_shards.whole(logits, 256)
    expected = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=whole)
    np.testing.assert_allclose(vocab_shards.cross_entropy(logits, targets), expected, rtol=2e-6)
    np.testing.assert_array_equal(vocab_shards.argmax(logits), tf.argmax(whole, axis=-1, output_type=tf.int32))


@pytest.mark.parametrize("vocab, rows", [(103, 26), (5, 2)], ids=["last-shard-part-padded", "a-shard-all-padded"])
def test_a_padded_vocabulary_is_the_unpadded_softmax_and_never_picked(vocab, rows):
    """V not divisible by 4: each shard has ceil(V/4) rows, the padded ones' logits are PADDED, so the sharded
    cross-entropy is the V-way one of the served (V-column) logits, the arg-max and the export never see them,
    and the loss gives their head columns no gradient."""
    import keras

    from models import layout, vocab_shards
    from models.transformer import transformer_lm

    keras.utils.set_random_seed(3)
    padded = layout.split_model(transformer_lm(vocab, layers=1, heads=4, width=16, context=8), (), 4)
    ids, targets = _ids(vocab=vocab), _ids(seed=1, vocab=vocab)
    kernels = [part.kernel for part in padded.head.parts]

    @tf.function  # a shard's backward is tf.gradients' (models.sharded.run): a graph
    def step():
        with tf.GradientTape() as tape:
            logits = padded(ids)
            loss = tf.reduce_sum(vocab_shards.cross_entropy(logits, targets))
        return logits, tape.gradient(loss, kernels)

    logits, grads = step()
    assert [x.shape[-1] for x in logits] == [rows] * 4
    served = vocab_shards.whole(logits, vocab)
    assert served.shape[-1] == vocab and float(tf.reduce_min(served)) > vocab_shards.PADDED
    expected = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=served)
    np.testing.assert_allclose(vocab_shards.cross_entropy(logits, targets), expected, rtol=2e-6)
    np.testing.assert_array_equal(vocab_shards.argmax(logits), tf.argmax(served, axis=-1, output_type=tf.int32))
    flat = tf.concat(grads, axis=-1)  # [width, 4 * rows]: the padded columns last
    assert float(tf.reduce_max(tf.abs(flat[:, vocab:]))) == 0.0 and float(tf.reduce_max(tf.abs(flat[:, :vocab]))) > 0
    first, _ = padded.cached_call(ids[:1], 0, padded.empty_cache(1))
    assert first.shape[-1] == vocab
    facts = vocab_shards.padding(padded)
    assert facts == {
        "vocabulary": vocab,
        "padded": 4 * rows,
        "shards": 4,
        "rows": 4 * rows - vocab,
        "parameters": 2 * 16 * (4 * rows - vocab),
    }


def test_a_vocabulary_the_shards_divide_is_not_padded(model):
    from models import vocab_shards

    assert vocab_shards.padding(model) is None
    assert vocab_shards.describe_padding(
        {"vocabulary": 103, "padded": 104, "shards": 4, "rows": 1, "parameters": 256}
    ) == (
        "vocabulary 103 padded to 104 for 4 shards (+1 row: 0.96% of the embedding and the head, +256 parameters); "
        "never a target, masked out of the softmax"
    )


def test_a_tie_goes_to_the_lowest_id_as_tf_argmax():
    from models import vocab_shards

    shards = (tf.constant([[[0.0, 1.0]]]), tf.constant([[[1.0, 0.5]]]))  # ids 1 and 2 tie at 1.0
    assert int(vocab_shards.argmax(shards)[0, 0]) == 1


def test_the_cached_path_gives_the_full_calls_logits(model):
    from models import vocab_shards

    ids = _ids(batch=1)
    full = vocab_shards.whole(model((ids, tf.fill([1], 8))), 256)
    first, cache = model.cached_call(ids[:, :5], 0, model.empty_cache(1))
    rest, _ = model.cached_call(ids[:, 5:], 5, cache)
    np.testing.assert_allclose(tf.concat([first, rest], axis=1), full, rtol=1e-5, atol=1e-6)


def test_each_shard_owns_its_slice_and_nothing_else(model):
    from models import sharded

    owners = sharded.shard_of_variables(model)
    by_shard = {k: [v.path for v in model.variables if owners.get(id(v)) == k] for k in range(4)}
    assert by_shard[2] == [
        "transformer_lm/token_embedding/token_embedding_shard_2/embeddings",
        "transformer_lm/block_0/attention/attention_shard_2/query/kernel",
        "transformer_lm/block_0/attention/attention_shard_2/query/bias",
        "transformer_lm/block_0/attention/attention_shard_2/key/kernel",
        "transformer_lm/block_0/attention/attention_shard_2/key/bias",
        "transformer_lm/block_0/attention/attention_shard_2/value/kernel",
        "transformer_lm/block_0/attention/attention_shard_2/value/bias",
        "transformer_lm/block_0/attention/attention_shard_2/output/kernel",
        "transformer_lm/block_0/mlp_in/mlp_in_shard_2/kernel",
        "transformer_lm/block_0/mlp_in/mlp_in_shard_2/bias",
        "transformer_lm/block_0/mlp_out/mlp_out_shard_2/kernel",
        "transformer_lm/head/head_shard_2/kernel",
    ]
    assert sharded.shard_count(model) == 4
    kernel = {v.path: tuple(v.shape) for v in model.variables}
    assert kernel["transformer_lm/block_0/mlp_in/mlp_in_shard_2/kernel"] == (16, 16)  # 64 hidden units / 4
    assert kernel["transformer_lm/block_0/attention/attention_shard_2/output/kernel"] == (4, 16)  # one head's rows
