"""The reference training loops: what a user would write without towerflow.

Both read the same in-memory batches as towerflow's memory sides, build the same architecture with the
same seed, and use the same optimizer (SGD, momentum 0.9, constant learning rate). Like Keras's own
`train_function`, the batch is taken from the iterator inside the `tf.function`, so the reference pays no
Python per batch that a careful user would not avoid either.
"""

from __future__ import annotations

import time

import keras
import tensorflow as tf

import models
from benchmarks.plan import Setting

LEARNING_RATE = 0.05
MOMENTUM = 0.9
SEED = 0


def _model_and_optimizer(setting: Setting):
    # The dtype policy is process-wide and a towerflow bf16/fp16 side may have set it in this worker.
    keras.mixed_precision.set_global_policy("float32")
    keras.utils.set_random_seed(SEED)
    model = models.build_model(setting.model, setting.example_shape, setting.num_classes)
    optimizer = keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)
    # Built up front: Keras 3 building its slots lazily inside a MirroredStrategy step fails.
    optimizer.build(model.trainable_variables)
    return model, optimizer


class PlainSide:
    """A single-device `tf.function` train step: model(x, training=True), cross-entropy, apply_gradients."""

    def __init__(self, setting: Setting, dataset: tf.data.Dataset):
        self.global_batch_size = setting.global_batch_size
        self.model, self.optimizer = _model_and_optimizer(setting)
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.iterator = iter(dataset)
        self._step_fn = tf.function(self._step)

    def _step(self, iterator):
        features, labels = next(iterator)
        with tf.GradientTape() as tape:
            logits = self.model(features, training=True)
            loss = self.loss_fn(labels, logits)
            if self.model.losses:  # resnet20's L2, which towerflow adds too
                loss += tf.add_n(self.model.losses)
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
        return loss

    def window(self, steps: int) -> tuple[float, int]:
        start = time.perf_counter()
        for _ in range(steps):
            loss = self._step_fn(self.iterator)
        float(loss)  # waits for the last step
        return time.perf_counter() - start, steps * self.global_batch_size

    def close(self) -> None:
        pass


class MirroredSide:
    """tf.distribute.MirroredStrategy over `num_devices` logical CPUs, custom loop (`strategy.run`/`reduce`).

    Cross-device reduction: `HierarchicalCopyAllReduce`, the fastest that works on CPUs. Measured against
    it with alternating windows (cnn-digits, 2 and 4 devices): ReductionToOneDevice 1-2% slower, the
    default CollectiveAllReduce 3-15% slower (and it fails unless the optimizer is built in scope); NCCL
    has no CPU kernels. The reference gets the fastest option.
    """

    def __init__(self, setting: Setting, dataset: tf.data.Dataset, num_devices: int):
        self.global_batch_size = setting.global_batch_size
        devices = [f"/device:CPU:{i}" for i in range(num_devices)]
        reduction = tf.distribute.HierarchicalCopyAllReduce()
        self.strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=reduction)
        with self.strategy.scope():
            self.model, self.optimizer = _model_and_optimizer(setting)
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        self.iterator = iter(self.strategy.experimental_distribute_dataset(dataset))
        self._step_fn = tf.function(self._step)

    def _replica_step(self, features, labels):
        with tf.GradientTape() as tape:
            logits = self.model(features, training=True)
            per_example = self.loss_fn(labels, logits)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=self.global_batch_size)
            if self.model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses))
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
        return loss

    def _step(self, iterator):
        features, labels = next(iterator)
        per_replica = self.strategy.run(self._replica_step, args=(features, labels))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def window(self, steps: int) -> tuple[float, int]:
        start = time.perf_counter()
        for _ in range(steps):
            loss = self._step_fn(self.iterator)
        float(loss)
        return time.perf_counter() - start, steps * self.global_batch_size

    def close(self) -> None:
        pass
