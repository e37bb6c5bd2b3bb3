"""The reference training loops: what a user would write without towerflow.

All read the same in-memory batches as towerflow's memory sides, build the same architecture with the
same seed, and use the same optimizer (SGD, momentum 0.9, constant learning rate). The custom loops take
the batch from the iterator inside the `tf.function`, as Keras's own `train_function` does, so they pay no
Python per batch that a careful user would not avoid either; `KerasFitSide` is Keras's `model.fit` itself.

Each reads its dataset under the options towerflow's streams run under (`data.options.with_run_options`, as
`trainer.loop.inputs.PlacedIterator` applies them): no side is timed with tf.data's autotuning model and
another without it.
"""

from __future__ import annotations

import functools
import queue
import threading
import time

import keras
import tensorflow as tf

import models
from benchmarks.harness.plan import Setting
from data.options import with_run_options

LEARNING_RATE = 0.05
MOMENTUM = 0.9
SEED = 0


def model_and_optimizer(setting: Setting, build_model=None):
    """The setting's model (`build_model()`, else its registered builder) and the references' optimizer."""
    # The dtype policy is process-wide and a towerflow bf16/fp16 side may have set it in this worker.
    keras.mixed_precision.set_global_policy("float32")
    keras.utils.set_random_seed(SEED)
    if build_model is None:
        model = models.build_model(setting.model, setting.example_shape, setting.num_classes)
    else:
        model = build_model()
    optimizer = keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)
    # Built up front: Keras 3 building its slots lazily inside a MirroredStrategy step fails.
    optimizer.build(model.trainable_variables)
    return model, optimizer


class PlainSide:
    """A single-device `tf.function` train step: model(x, training=True), cross-entropy, apply_gradients."""

    def __init__(self, setting: Setting, dataset: tf.data.Dataset):
        self.global_batch_size = setting.global_batch_size
        self.model, self.optimizer = model_and_optimizer(setting)
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.iterator = iter(with_run_options(dataset))
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


def mirrored_strategy(num_devices: int) -> tf.distribute.MirroredStrategy:
    """MirroredStrategy over the first `num_devices` logical CPUs with the fastest reduction here (`MirroredSide`)."""
    devices = [f"/device:CPU:{i}" for i in range(num_devices)]
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.HierarchicalCopyAllReduce())


class MirroredSide:
    """tf.distribute.MirroredStrategy over `num_devices` logical CPUs, custom loop (`strategy.run`/`reduce`).

    Cross-device reduction: `HierarchicalCopyAllReduce`, the fastest that works on CPUs. Measured against
    it with alternating windows (cnn-digits, 2 and 4 devices): ReductionToOneDevice 1-2% slower, the
    default CollectiveAllReduce 3-15% slower (and it fails unless the optimizer is built in scope); NCCL
    has no CPU kernels. The reference gets the fastest option.
    """

    def __init__(self, setting: Setting, dataset: tf.data.Dataset, num_devices: int):
        self.global_batch_size = setting.global_batch_size
        self.strategy = mirrored_strategy(num_devices)
        with self.strategy.scope():
            self.model, self.optimizer = model_and_optimizer(setting)
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        self.iterator = iter(self.strategy.experimental_distribute_dataset(with_run_options(dataset)))
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


class _Pauses(keras.callbacks.Callback):
    """Holds a running `fit` at an execution boundary until the next window's order of steps arrives.

    Only `on_train_batch_begin` is overridden: it is called in `fit`'s own thread with no logs, so Keras still
    dispatches its batch-end callbacks asynchronously, as in a user's fit without callbacks.
    """

    def __init__(self, steps_per_execution: int):
        super().__init__()
        self.steps_per_execution = steps_per_execution
        self.orders: queue.Queue = queue.Queue()  # steps of the next window; None: stop
        self.finished: queue.Queue = queue.Queue()  # None when a window's steps have run, else the error
        self.remaining = 0
        self.started = False

    def on_train_batch_begin(self, batch, logs=None):
        if self.remaining <= 0:
            if self.started:
                self.finished.put(None)
            self.started = True
            order = self.orders.get()
            if order is None:
                self.model.stop_training = True  # after this execution, which nobody times
                return
            self.remaining = order
        self.remaining -= self.steps_per_execution


class KerasFitSide:
    """`model.compile(..., steps_per_execution=S)` and one `model.fit` for the side's life: what most TensorFlow
    users run.

    One device: no strategy; more: built, compiled and fitted under `mirrored_strategy`, over which Keras's
    `fit` distributes the dataset. `jit_compile` stays at Keras's "auto", which is off on a CPU-only machine.
    Metrics: the loss, which Keras always tracks, and with `accuracy` Keras's "accuracy", as its documentation's
    `compile` examples have it and as towerflow reports both (towerflow also computes the gradient norm and
    checks every update is finite, which Keras does not).
    `fit` runs in a thread of its own, started by the first window, and a callback holds it between windows,
    so a window times `fit`'s steady state (as in a long run), not its start-up (a new distributed iterator
    per call: ~0.1 s under MirroredStrategy). A window runs whole executions of S steps (at least `steps`).
    """

    def __init__(self, setting: Setting, dataset, num_devices: int, steps_per_execution: int, accuracy: bool):
        self.global_batch_size = setting.global_batch_size
        strategy = mirrored_strategy(num_devices) if num_devices > 1 else tf.distribute.get_strategy()
        with strategy.scope():
            self.model = self.compiled(setting, accuracy, steps_per_execution)
        self.pauses = _Pauses(steps_per_execution)
        fit = functools.partial(
            self.model.fit,
            with_run_options(dataset),
            epochs=1,
            steps_per_epoch=10**12,
            verbose=0,
            shuffle=False,
            callbacks=[self.pauses],
        )
        self.thread = threading.Thread(target=self._fit, args=(fit,), name="keras-fit", daemon=True)

    def compiled(self, setting: Setting, accuracy: bool, steps_per_execution: int) -> keras.Model:
        """The model, compiled (inside the strategy's scope); a task's peer overrides it (benchmarks/harness/lm.py)."""
        model, optimizer = model_and_optimizer(setting)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        metrics = ["accuracy"] if accuracy else []
        model.compile(optimizer, loss, metrics=metrics, steps_per_execution=steps_per_execution)
        return model

    def _fit(self, fit) -> None:
        try:
            fit()
        except BaseException as e:  # handed to the window waiting for it
            self.pauses.finished.put(e)

    def window(self, steps: int) -> tuple[float, int]:
        before = int(self.model.optimizer.iterations.numpy())
        start = time.perf_counter()
        self.pauses.orders.put(steps)
        if self.thread.ident is None:
            self.thread.start()
        error = self.pauses.finished.get()
        seconds = time.perf_counter() - start
        if error is not None:
            raise error
        return seconds, (int(self.model.optimizer.iterations.numpy()) - before) * self.global_batch_size

    def close(self) -> None:
        if self.thread.is_alive():
            self.pauses.orders.put(None)
            self.thread.join()
