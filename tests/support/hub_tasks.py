"""A user's language-model task around a Keras Hub backbone, written only against docs/tasks.md: the backbone
built by Keras Hub's own code from a small config (random weights, nothing downloaded), next-token cross-entropy
on fixed-length token records, the head tied to the embedding as Keras Hub's causal LMs tie it
(``token_embedding(h, reverse=True)``). Run it as ``--task=tests.support.hub_tasks:HubGPT2`` (or ``HubLlama``)
from the repository's root. keras-hub is a test extra, never a dependency of the trainer.

`write_records` makes its records: windows of a fixed repeating token pattern with noise, so a model can learn.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf

import data
from tasks import Feature, Task

VOCAB = 64
CONTEXT = 16
WIDTH = 32
HEADS = 4


def gpt2_backbone():
    import keras_hub

    return keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_heads=HEADS,
        hidden_dim=WIDTH,
        intermediate_dim=2 * WIDTH,
        max_sequence_length=CONTEXT,
        dropout=0.0,
    )


def llama_backbone():
    import keras_hub

    return keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_query_heads=HEADS,
        num_key_value_heads=2,
        hidden_dim=WIDTH,
        intermediate_dim=2 * WIDTH,
    )


def causal_lm(backbone, name: str) -> keras.Model:
    """token_ids, padding_mask -> logits [B, T, VOCAB] through ``backbone``, its head the embedding reversed."""
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    hidden = backbone({"token_ids": ids, "padding_mask": mask})
    logits = backbone.token_embedding(hidden, reverse=True)
    return keras.Model({"token_ids": ids, "padding_mask": mask}, logits, name=name)


class HubGPT2(Task):
    """Next-token prediction with Keras Hub's GPT2Backbone."""

    name = "hub_gpt2"
    metric_names = ("accuracy",)
    eval_metric = "accuracy"

    def features(self):
        return {"tokens": Feature("int64", shape=(CONTEXT + 1,))}

    def build_model(self):
        return causal_lm(gpt2_backbone(), self.name)

    def model_inputs(self, batch):
        ids = tf.cast(batch["tokens"][:, :-1], tf.int32)
        return {"token_ids": ids, "padding_mask": tf.ones_like(ids)}

    def loss(self, outputs, batch):
        targets = batch["tokens"][:, 1:]
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(targets, tf.cast(outputs, tf.float32))
        return losses, tf.ones_like(losses)

    def metrics(self, outputs, batch):
        hits = tf.cast(tf.equal(tf.argmax(outputs, -1), batch["tokens"][:, 1:]), tf.float32)
        return {"accuracy": (tf.reduce_sum(hits), tf.cast(tf.size(hits), tf.float32))}


class HubLlama(HubGPT2):
    """The same with Keras Hub's LlamaBackbone (grouped-query attention, SwiGLU, RMS norms)."""

    name = "hub_llama"

    def build_model(self):
        return causal_lm(llama_backbone(), self.name)


def examples(n: int, seed: int) -> list[dict]:
    """``n`` windows of CONTEXT + 1 tokens of a repeating ramp, one token in eight replaced at random."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, VOCAB, size=n)
    windows = (starts[:, None] + np.arange(CONTEXT + 1)[None, :]) % VOCAB
    noise = rng.random(windows.shape) < 0.125
    windows[noise] = rng.integers(0, VOCAB, size=int(noise.sum()))
    return [{"tokens": window} for window in windows]


def write_records(directory: str, train: int = 256, evaluation: int = 64) -> tuple[str, str]:
    """train.tfrecord and eval.tfrecord under ``directory``; returns their paths."""
    schema = data.FeatureSchema.of(HubGPT2.features(None), HubGPT2.name)
    paths = os.path.join(directory, "train.tfrecord"), os.path.join(directory, "eval.tfrecord")
    for path, (n, seed) in zip(paths, ((train, 0), (evaluation, 1)), strict=True):
        data.write_feature_records(path, examples(n, seed), schema)
    return paths
