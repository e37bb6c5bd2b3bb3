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

    from models.transformer import transformer_lm

    keras.utils.set_random_seed(3)
    return transformer_lm(256, layers=1, heads=4, width=16, context=8, shards=4)


def _ids(batch=3, length=8, seed=0):
    return tf.constant(np.random.RandomState(seed).randint(0, 256, (batch, length)), tf.int32)


def test_the_logits_come_as_four_vocabulary_shards(model):
    logits = model(_ids())
    assert isinstance(logits, tuple) and [tuple(x.shape) for x in logits] == [(3, 8, 64)] * 4


def test_the_sharded_cross_entropy_and_argmax_are_those_of_the_whole_logits(model):
    from models import vocab_shards

    logits, targets = model(_ids()), _ids(seed=1)
    whole = vocab_shards.whole(logits)
    expected = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=whole)
    np.testing.assert_allclose(vocab_shards.cross_entropy(logits, targets), expected, rtol=2e-6)
    np.testing.assert_array_equal(vocab_shards.argmax(logits), tf.argmax(whole, axis=-1, output_type=tf.int32))


def test_a_tie_goes_to_the_lowest_id_as_tf_argmax():
    from models import vocab_shards

    shards = (tf.constant([[[0.0, 1.0]]]), tf.constant([[[1.0, 0.5]]]))  # ids 1 and 2 tie at 1.0
    assert int(vocab_shards.argmax(shards)[0, 0]) == 1


def test_the_cached_path_gives_the_full_calls_logits(model):
    from models import vocab_shards

    ids = _ids(batch=1)
    full = vocab_shards.whole(model((ids, tf.fill([1], 8))))
    first, cache = model.cached_call(ids[:, :5], 0, model.empty_cache(1))
    rest, _ = model.cached_call(ids[:, 5:], 5, cache)
    np.testing.assert_allclose(tf.concat([first, rest], axis=1), full, rtol=1e-5, atol=1e-6)


def test_each_shard_owns_its_slice_and_nothing_else(model):
    from models import sharded

    owners = sharded.shard_of_variables(model)
    by_shard = {k: [v.path for v in model.variables if owners.get(id(v)) == k] for k in range(4)}
    assert by_shard[2] == [
        "transformer_lm/token_embedding/token_embedding_shard_2/embeddings",
        "transformer_lm/block_0/attention/query_shard_2/kernel",
        "transformer_lm/block_0/attention/query_shard_2/bias",
        "transformer_lm/block_0/attention/key_shard_2/kernel",
        "transformer_lm/block_0/attention/key_shard_2/bias",
        "transformer_lm/block_0/attention/value_shard_2/kernel",
        "transformer_lm/block_0/attention/value_shard_2/bias",
        "transformer_lm/block_0/attention/output_shard_2/kernel",
        "transformer_lm/block_0/mlp_in_shard_2/kernel",
        "transformer_lm/block_0/mlp_in_shard_2/bias",
        "transformer_lm/block_0/mlp_out_shard_2/kernel",
        "transformer_lm/head/head_shard_2/kernel",
    ]
    assert sharded.shard_count(model) == 4
    kernel = {v.path: tuple(v.shape) for v in model.variables}
    assert kernel["transformer_lm/block_0/mlp_in_shard_2/kernel"] == (16, 16)  # 64 hidden units / 4
    assert kernel["transformer_lm/block_0/attention/output_shard_2/kernel"] == (4, 16)  # one head's rows
