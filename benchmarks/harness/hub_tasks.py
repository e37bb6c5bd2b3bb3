"""A user's language-model tasks around Keras Hub backbones, written only against docs/tasks.md: the backbone
built by Keras Hub's own code from a small config (random weights, nothing downloaded), nested as one layer of
the task's functional model, next-token cross-entropy over token windows. The padding mask is computed in
`model_inputs`, so it reaches the model as an input (and crosses each pipeline cut beside the activations).
Run them as ``--task=benchmarks.harness.hub_tasks:HubGPT2`` (or ``TiedGPT2``, ``HubLlama``) from the repository's
root. keras-hub is a test extra: the trainer never imports it, and this module imports it only to build.

`write_records` makes their records: windows of 3..CONTEXT+1 random token ids, padded per micro-batch.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf

import data
from tasks import Feature, Task

VOCAB = 64
CONTEXT = 8
HEADS = 4
WIDTH = 32


def gpt2_backbone(layers: int = 2, dropout: float = 0.0) -> keras.Model:
    import keras_hub

    return keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB, num_layers=layers, num_heads=HEADS, hidden_dim=WIDTH, intermediate_dim=2 * WIDTH,
        max_sequence_length=2 * CONTEXT, dropout=dropout,
    )  # fmt: skip


def llama_backbone(layers: int = 2) -> keras.Model:
    import keras_hub

    return keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCAB, num_layers=layers, num_query_heads=HEADS, num_key_value_heads=2, hidden_dim=WIDTH,
        intermediate_dim=2 * WIDTH,
    )  # fmt: skip


def task_model(backbone: keras.Model, name: str = "hub_gpt2", tied: bool = False) -> keras.Model:
    """{token_ids, padding_mask} -> the backbone -> logits [B, T, VOCAB]: an untied Dense head, or with ``tied``
    the embedding reversed, as Keras Hub's causal LMs tie it (a pipeline cannot cut tied weights apart)."""
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in ("token_ids", "padding_mask")}
    hidden = backbone(inputs)
    logits = backbone.token_embedding(hidden, reverse=True) if tied else keras.layers.Dense(VOCAB, name="head")(hidden)
    return keras.Model(inputs, logits, name=name)


class HubGPT2(Task):
    """Next-token prediction with one GPT-2 block (dropout 0.1) and an untied head."""

    name = "hub_gpt2"
    metric_names = ("accuracy",)
    eval_metric = "accuracy"

    def features(self):
        return {"tokens": Feature("int64", max_length=CONTEXT + 1, buckets=(CONTEXT + 1,), bounds=(0, VOCAB))}

    def build_model(self):
        return task_model(gpt2_backbone(layers=1, dropout=0.1))

    def model_inputs(self, batch):
        ids = tf.cast(batch["tokens"][:, :-1], tf.int32)
        mask = tf.sequence_mask(batch["tokens_length"] - 1, tf.shape(ids)[1], tf.int32)
        return {"token_ids": ids, "padding_mask": mask}

    def loss(self, outputs, batch):
        targets = batch["tokens"][:, 1:]
        losses = keras.losses.sparse_categorical_crossentropy(targets, outputs, from_logits=True)
        return losses, self._weights(batch)

    def metrics(self, outputs, batch):
        hits = tf.cast(tf.equal(tf.argmax(outputs, -1), batch["tokens"][:, 1:]), tf.float32) * self._weights(batch)
        return {"accuracy": (tf.reduce_sum(hits), tf.reduce_sum(self._weights(batch)))}

    def _weights(self, batch):
        return tf.sequence_mask(batch["tokens_length"] - 1, tf.shape(batch["tokens"])[1] - 1, tf.float32)


class TiedGPT2(HubGPT2):
    """Two GPT-2 blocks, no dropout, the head tied to the embedding (GPT2CausalLM's)."""

    name = "tied_gpt2"

    def build_model(self):
        return task_model(gpt2_backbone(), self.name, tied=True)


class HubLlama(HubGPT2):
    """Two Llama blocks (grouped-query attention, SwiGLU, RMS norms), the head tied."""

    name = "hub_llama"

    def build_model(self):
        return task_model(llama_backbone(), self.name, tied=True)


def write_records(directory: str, records: int = 64) -> tuple[str, str]:
    """A train file of ``records`` windows of 3..CONTEXT+1 ids in [1, VOCAB) and an eval file of 16; returns
    their paths."""
    rng = np.random.default_rng(5)
    schema = data.FeatureSchema.of(HubGPT2.features(None), HubGPT2.name)
    paths = []
    for name, count in (("train-00000-of-00001", records), ("eval", 16)):
        windows = [{"tokens": rng.integers(1, VOCAB, size=rng.integers(3, CONTEXT + 2))} for _ in range(count)]
        paths.append(os.path.join(directory, f"{name}.tfrecord"))
        data.write_feature_records(paths[-1], windows, schema)
    return tuple(paths)
