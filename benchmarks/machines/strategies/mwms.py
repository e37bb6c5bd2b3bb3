"""One task of the sync peer: `tf.distribute.MultiWorkerMirroredStrategy` + Keras `fit`, as TensorFlow's
multi-worker Keras tutorial writes it (TF_CONFIG per task, model and compile under `strategy.scope()`, one
global-batch dataset that `fit` auto-shards across the workers).

    TF_CONFIG=... python -m benchmarks.machines.strategies.mwms --steps=300 --out=task0.json

The same model as towerflow's (models registry `cnn`, digits 8x8x1, the same pixels / 255), the same global
batch and optimizer as towerflow's defaults (momentum 0.9, learning rate 0.05, cosine decay over the run's
steps), data in memory. Not handicapped: `steps_per_execution` as Keras allows, no callbacks but a clock,
the first execution (tracing) left out of the rate, as towerflow leaves out its first step.

Writes JSON: examples/sec over the timed executions, steps, the loss on a fixed batch before and after, and
the SHA-256 of the final weights in `model.variables` order (towerflow's `weights_sha256` rule).
Without TF_CONFIG it is one worker (MWMS's local mode: one CPU device, see benchmarks/results/peers.md).
"""

from __future__ import annotations

import argparse
import json
import os
import time

LEARNING_RATE = 0.05
MOMENTUM = 0.9
NUM_CLASSES = 10
SHAPE = (8, 8, 1)
LOSS_BATCH = 512  # the fixed batch the loss is measured on, before and after


class Clock:
    """A Keras callback that notes when each execution of `steps_per_execution` steps ends."""

    def __init__(self):
        import keras  # noqa: PLC0415 (TensorFlow starts only in the task process)

        outer = self

        class _Callback(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                outer.ends.append((batch + 1, time.perf_counter()))

        self.ends: list[tuple[int, float]] = []
        self.callback = _Callback()

    def rate(self, global_batch: int) -> tuple[float, int, float]:
        """(examples/sec after the first execution, steps timed, seconds timed)."""
        (first_step, first_time), (last_step, last_time) = self.ends[0], self.ends[-1]
        steps, seconds = last_step - first_step, last_time - first_time
        return (steps * global_batch / seconds if seconds > 0 else 0.0), steps, seconds


def weights_sha256(variables) -> str:
    from trainer.outputs.report import weights_sha256 as towerflow_rule  # noqa: PLC0415 (the one rule)

    return towerflow_rule(variables)


def _data(global_batch: int, seed: int):
    import tensorflow as tf  # noqa: PLC0415

    from data.digits import digits_splits  # noqa: PLC0415

    (images, labels), _ = digits_splits()
    images = images.astype("float32") / 255.0
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(len(labels), seed=seed)
    dataset = dataset.repeat().batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return dataset, (images[:LOSS_BATCH], labels[:LOSS_BATCH])


def _build(strategy, steps: int):
    """The model, its optimizer (built: its slots exist before the first step) and the per-example loss,
    created under the strategy's scope as its tutorials do."""
    import keras  # noqa: PLC0415

    import models  # noqa: PLC0415

    with strategy.scope():
        model = models.build_model("cnn", SHAPE, NUM_CLASSES)
        schedule = keras.optimizers.schedules.CosineDecay(LEARNING_RATE, steps)
        optimizer = keras.optimizers.SGD(learning_rate=schedule, momentum=MOMENTUM)
        optimizer.build(model.trainable_variables)
    return model, optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def _fit(strategy, model, optimizer, loss, dataset, steps: int, steps_per_execution: int) -> Clock:
    """Keras `fit`, as the multi-worker Keras tutorial writes it. Fails with several workers on Keras 3.x
    (keras-team/keras#20585): kept to show it, `--loop=fit`."""
    import keras  # noqa: PLC0415

    with strategy.scope():
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=steps_per_execution)  # fmt: skip
    clock = Clock()
    model.fit(dataset, epochs=1, steps_per_epoch=steps, callbacks=[clock.callback], verbose=0)
    return clock


def _custom_loop(strategy, model, optimizer, loss, dataset, steps: int, steps_per_execution: int) -> Clock:
    """The custom training loop of TensorFlow's "multi-worker training with a custom training loop" tutorial:
    `experimental_distribute_dataset`, `strategy.run` of a replica step, the loss averaged over the GLOBAL
    batch (`tf.nn.compute_average_loss`), and `steps_per_execution` steps per `tf.function` call."""
    import tensorflow as tf  # noqa: PLC0415

    global_batch = dataset.element_spec[1].shape[0]
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = loss(y, model(x, training=True))
            value = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(value, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return value

    @tf.function
    def execution(iterator):
        for _ in tf.range(steps_per_execution):
            strategy.run(replica_step, args=next(iterator))

    clock = Clock()
    for done in range(steps_per_execution, steps + 1, steps_per_execution):
        execution(iterator)
        int(optimizer.iterations.numpy())  # waits for the execution: the clock times finished steps
        clock.ends.append((done, time.perf_counter()))
    return clock


LOOPS = {"ctl": _custom_loop, "fit": _fit}


def train(steps, global_batch, steps_per_execution, seed, deterministic, loop="ctl", threads=0) -> dict:
    """Trains the peer for `steps` steps (a multiple of `steps_per_execution`) in this task; returns its
    figures (every task returns them). `threads`: intra-op threads (0: TensorFlow's default, one per core)."""
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    keras.utils.set_random_seed(seed)
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    dataset, (x, y) = _data(global_batch, seed)
    model, optimizer, loss = _build(strategy, steps)
    before = float(tf.reduce_mean(loss(y, model(x, training=False))))
    started = time.perf_counter()
    clock = LOOPS[loop](strategy, model, optimizer, loss, dataset, steps, steps_per_execution)
    wall = time.perf_counter() - started
    rate, timed_steps, timed_sec = clock.rate(global_batch)
    return {
        "loop": loop,
        "replicas": strategy.num_replicas_in_sync,
        "devices": list(strategy.extended.worker_devices),
        "steps": int(optimizer.iterations.numpy()),
        "examples_per_sec": rate,
        "timed_steps": timed_steps,
        "timed_seconds": timed_sec,
        "loop_seconds": wall,
        "loss_before": before,
        "loss_after": float(tf.reduce_mean(loss(y, model(x, training=False)))),
        "weights_sha256": weights_sha256(model.variables),
        "trainable_sha256": weights_sha256(model.trainable_variables),
        "variables": {v.path: weights_sha256([v])[:12] for v in model.variables},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.machines.strategies.mwms", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--global_batch_size", type=int, default=128)
    parser.add_argument("--steps_per_execution", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deterministic", action="store_true", help="tf.config.experimental.enable_op_determinism")
    parser.add_argument("--intra_op_threads", type=int, default=0, help="as towerflow's flag; 0: one per core")
    parser.add_argument("--loop", default="ctl", choices=list(LOOPS), help="ctl: custom loop; fit: Keras fit")
    parser.add_argument("--out", required=True, help="this task's JSON")
    args = parser.parse_args(argv)
    if args.steps % args.steps_per_execution:
        parser.error("--steps: a multiple of --steps_per_execution")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = train(
        args.steps,
        args.global_batch_size,
        args.steps_per_execution,
        args.seed,
        args.deterministic,
        args.loop,
        args.intra_op_threads,
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
