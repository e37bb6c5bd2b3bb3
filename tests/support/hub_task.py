"""A user's language-model task built on a Keras Hub backbone (a functional model nested as one layer of the task's
functional model): `HubGPT2`, a small `keras_hub.models.GPT2Backbone` from a config (random weights, nothing
downloaded) with an untied Dense head over token windows, written against docs/tasks.md only. Imported by tests
that skip without keras-hub (`pytest.importorskip("keras_hub")`): the trainer never imports it.

`write_records` makes its records: windows of 3..CONTEXT+1 random token ids, padded per micro-batch.
"""

from __future__ import annotations

import os

import keras
import keras_hub
import numpy as np
import tensorflow as tf

import data
from tasks import Feature, Task

VOCAB = 64
CONTEXT = 8


def gpt2_backbone(layers: int = 2, dropout: float = 0.0) -> keras.Model:
    return keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB, num_layers=layers, num_heads=4, hidden_dim=32, intermediate_dim=64,
        max_sequence_length=2 * CONTEXT, dropout=dropout,
    )  # fmt: skip


def llama_backbone(layers: int = 2) -> keras.Model:
    return keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCAB, num_layers=layers, num_query_heads=4, num_key_value_heads=2, hidden_dim=32,
        intermediate_dim=64,
    )  # fmt: skip


def task_model(backbone: keras.Model, name: str = "hub_gpt2") -> keras.Model:
    """The task's model: {token_ids, padding_mask} -> the backbone -> an untied Dense head -> logits."""
    inputs = {
        "token_ids": keras.Input((None,), dtype="int32", name="token_ids"),
        "padding_mask": keras.Input((None,), dtype="int32", name="padding_mask"),
    }
    logits = keras.layers.Dense(VOCAB, name="head")(backbone(inputs))
    return keras.Model(inputs, logits, name=name)


class HubGPT2(Task):
    """Next-token prediction over `tokens` windows; the padding mask is computed in `model_inputs`, so it reaches
    the model as an input (and crosses each pipeline cut beside the activations)."""

    name = "hub_gpt2"

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
        weights = tf.sequence_mask(batch["tokens_length"] - 1, tf.shape(targets)[1], tf.float32)
        return losses, weights


def write_records(directory: str, records: int = 64) -> tuple[str, str]:
    """A train file of `records` windows of 3..CONTEXT+1 ids in [1, VOCAB) and an eval file of 16; returns their
    paths."""
    rng = np.random.default_rng(5)
    schema = data.FeatureSchema.of(HubGPT2.features(None), HubGPT2.name)
    paths = []
    for name, count in (("train-00000-of-00001", records), ("eval", 16)):
        windows = [{"tokens": rng.integers(1, VOCAB, size=rng.integers(3, CONTEXT + 2))} for _ in range(count)]
        paths.append(os.path.join(directory, f"{name}.tfrecord"))
        data.write_feature_records(paths[-1], windows, schema)
    return tuple(paths)
