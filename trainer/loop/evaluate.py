"""Evaluation: loss and accuracy over the whole eval set, the batch split across the towers."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from trainer.step import tree
from trainer.system.devices import Placement


class Evaluator:
    """Runs the model in inference mode over every eval example once.

    Each batch is split into N near-equal parts (the last batch may be short, so the parts may differ by one
    example); tower i scores part i; sums are reduced on the parameter device in tower order.

    Args:
      model: the Keras model (logits out).
      placement: tower and parameter devices.
      make_dataset: () -> finite dataset of (features, labels).
      explain: error -> the exception to raise instead (e.g. a `data.DataError` naming a bad eval record), or
        None to raise the error itself; called when evaluating raises a `tf.errors.OpError`.
    """

    def __init__(self, model, placement: Placement, make_dataset, explain=None):
        self.model = model
        self.placement = placement
        self.make_dataset = make_dataset
        self.explain = explain or (lambda error: None)
        self._eval_fn = tf.function(self._batch_sums)

    def evaluate(self, should_stop=None) -> dict | None:
        """Returns {"eval_loss", "eval_accuracy", "eval_examples"} as Python numbers, or None when
        `should_stop()` turned true between two batches (a stop request does not wait for a long eval).

        Raises:
          What `explain` makes of a `tf.errors.OpError` (the eval data's own failures surface here).
        """
        try:
            return self._evaluate(should_stop)
        except tf.errors.OpError as e:
            explained = self.explain(e)
            if explained is None:
                raise
            raise explained from e

    def _evaluate(self, should_stop) -> dict | None:
        loss_sum, correct, count = 0.0, 0, 0
        for features, labels in self.make_dataset():
            if should_stop is not None and should_stop():
                return None
            batch_loss, batch_correct = self._eval_fn(features, labels)
            loss_sum += float(batch_loss)
            correct += int(batch_correct)
            count += int(labels.shape[0])
        if count == 0:
            raise ValueError("the eval data holds no examples")
        return {"eval_loss": loss_sum / count, "eval_accuracy": correct / count, "eval_examples": count}

    def predictions(self) -> tuple[np.ndarray, np.ndarray]:
        """(logits float32 [N, classes], labels int32 [N]) of every eval example, in the eval data's order: the
        logits `evaluate` scores (the same towers, split and graph; its prediction is their argmax). For
        checking what serves against what was evaluated."""
        logits_fn = tf.function(self._batch_logits)
        logits, labels = [], []
        for features, batch_labels in self.make_dataset():
            logits.append(logits_fn(features, batch_labels).numpy())
            labels.append(batch_labels.numpy())
        return np.concatenate(logits), np.concatenate(labels)

    def _batch_sums(self, features, labels):
        losses, corrects = [], []
        for device, logits, y in self._tower_logits(features, labels):
            with tf.device(device):
                per_example = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
                losses.append(tf.reduce_sum(per_example))
                hits = tf.equal(tf.argmax(logits, axis=-1, output_type=y.dtype), y)
                corrects.append(tf.reduce_sum(tf.cast(hits, tf.int32)))
        with tf.device(self.placement.parameter_device):
            return tree.tree_sum(losses), tree.tree_sum(corrects)

    def _batch_logits(self, features, labels):
        parts = [logits for _, logits, _ in self._tower_logits(features, labels)]
        with tf.device(self.placement.host):
            return tf.concat(parts, axis=0)

    def _tower_logits(self, features, labels) -> list[tuple[str, tf.Tensor, tf.Tensor]]:
        """(tower, logits float32, labels) of each tower's part of the batch: part i on tower i, in tower order."""
        num_towers = len(self.placement.towers)
        with tf.device(self.placement.host):
            size = tf.shape(labels)[0]
            sizes = size // num_towers + tf.cast(tf.range(num_towers) < size % num_towers, tf.int32)
            feature_parts = tf.split(features, sizes, num=num_towers)
            label_parts = tf.split(labels, sizes, num=num_towers)
        parts = []
        for device, x, y in zip(self.placement.towers, feature_parts, label_parts, strict=True):
            with tf.device(device):
                parts.append((device, tf.cast(self.model(x, training=False), tf.float32), y))
        return parts
