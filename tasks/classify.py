"""The built-in classification task (`--task=classify`): images or dense vectors, softmax cross-entropy,
accuracy. It picks the engine's labeled records (images and vectors with class labels, read by `data.pipeline`,
whose decoding, augmentation, normalization, cache and serving signatures it keeps: `records = "labeled"`);
its model is `--model` (`models.build_model`); what it checks before TensorFlow is in `tasks.classify_options`."""

from __future__ import annotations

import keras
import tensorflow as tf

import models
from tasks.base import Task


class Classify(Task):
    """Batches are (features, labels): features float32 [B, *example_shape], labels int32 [B] in
    [0, num_classes). Loss: softmax cross-entropy of the model's logits, weight 1 per example."""

    name = "classify"
    eval_metric = "accuracy"
    metric_names = ("accuracy",)
    records = "labeled"  # images and vectors with class labels: the engine's reader (`trainer.loop.records`)

    def bind(self, example_shape: tuple[int, ...], num_classes: int) -> None:
        """What the records hold, once inspected: the model is built for it."""
        self.example_shape, self.num_classes = tuple(example_shape), int(num_classes)

    def build_model(self) -> keras.Model:
        return models.build_model(self.config.model.name, self.example_shape, self.num_classes)

    def model_inputs(self, batch):
        return batch[0]

    def loss(self, outputs, batch):
        losses = keras.losses.sparse_categorical_crossentropy(batch[1], outputs, from_logits=True)
        return losses, tf.ones_like(losses)

    def metrics(self, outputs, batch):
        labels = batch[1]
        hits = tf.equal(tf.argmax(outputs, axis=-1, output_type=labels.dtype), labels)
        return {"accuracy": (tf.reduce_sum(tf.cast(hits, tf.float32)), tf.cast(tf.size(labels), tf.float32))}

    def named_model(self) -> str:
        return self.config.model.name

    def model_description(self, model: keras.Model) -> str:
        return self.config.model.name
