"""One task of the async peer: `tf.distribute.experimental.ParameterServerStrategy` + `ClusterCoordinator`,
as TensorFlow's "Parameter server training" tutorial writes its custom training loop: workers and parameter
servers are `tf.distribute.Server`s that join; the chief builds the model under `strategy.scope()`, makes a
per-worker dataset (`coordinator.create_per_worker_dataset`) and `coordinator.schedule`s a `tf.function` of
`strategy.run`s, then `coordinator.join()`s.

    TF_CONFIG=... python -m benchmarks.machines.strategies.ps --updates=400 --out=chief.json   # every task alike

The chief writes JSON: examples/sec over the updates after the first round (one execution per worker, which
traces), updates, the loss on a fixed batch before and after, and staleness as towerflow defines it (the
updates other workers applied between a step's read of the global step and its own apply; see `replica_step`).
Same model, data and optimizer as towerflow's async mode: one update per micro-batch of
`--examples_per_update` examples, learning rate 0.05 / K, momentum 1 - K (1 - 0.9) (K = the workers), cosine.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from benchmarks.machines.strategies.mwms import LOSS_BATCH, NUM_CLASSES, SHAPE, weights_sha256


def serve(resolver) -> None:
    """A worker or ps task: a gRPC server until it is killed (the tutorial's `server.join()`)."""
    import tensorflow as tf  # noqa: PLC0415

    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id, protocol="grpc"
    )
    server.join()


def _dataset_fn(batch: int, seed: int):
    import tensorflow as tf  # noqa: PLC0415

    from data.digits import digits_splits  # noqa: PLC0415

    (images, labels), _ = digits_splits()
    images = images.astype("float32") / 255.0

    def dataset_fn(_input_context=None):
        dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(len(labels), seed=seed)
        return dataset.repeat().batch(batch, drop_remainder=True).prefetch(2)

    return dataset_fn, (images[:LOSS_BATCH], labels[:LOSS_BATCH])


def _build(strategy, updates: int, workers: int):
    import keras  # noqa: PLC0415

    import models  # noqa: PLC0415

    with strategy.scope():
        model = models.build_model("cnn", SHAPE, NUM_CLASSES)
        schedule = keras.optimizers.schedules.CosineDecay(0.05 / workers, updates)
        optimizer = keras.optimizers.SGD(learning_rate=schedule, momentum=1 - workers * (1 - 0.9))
        optimizer.build(model.trainable_variables)
    return model, optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def _execution(strategy, model, optimizer, loss, steps: int):
    """`steps` updates on one worker per call; returns (sum of their staleness, max, last loss)."""
    import tensorflow as tf  # noqa: PLC0415

    def replica_step(x, y):
        seen = tf.identity(optimizer.iterations)  # the global step, on the ps, before this step's reads
        with tf.control_dependencies([seen]), tf.GradientTape() as tape:
            value = tf.reduce_mean(loss(y, model(x, training=True)))
        grads = tape.gradient(value, model.trainable_variables)
        with tf.control_dependencies(grads):
            now = tf.identity(optimizer.iterations)  # updates applied meanwhile, by the other workers
        with tf.control_dependencies([now]):
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return now - seen, value

    @tf.function
    def execution(iterator):
        total, most, last = tf.constant(0, tf.int64), tf.constant(0, tf.int64), tf.constant(0.0)
        for _ in tf.range(steps):
            stale, last = strategy.run(replica_step, args=next(iterator))
            total, most = total + stale, tf.maximum(most, stale)
        return total, most, last

    return execution


def train(updates: int, batch: int, steps: int, seed: int) -> dict:
    """The chief's loop: the first round (one execution per worker) untimed, then the rest, timed."""
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    keras.utils.set_random_seed(seed)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    workers = len(resolver.cluster_spec().as_dict()["worker"])
    model, optimizer, loss = _build(strategy, updates, workers)
    dataset_fn, (x, y) = _dataset_fn(batch, seed)
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    execution = _execution(strategy, model, optimizer, loss, steps)
    before = float(tf.reduce_mean(loss(y, model(x, training=False))))
    warm = [coordinator.schedule(execution, args=(iterator,)) for _ in range(workers)]
    coordinator.join()
    started = time.perf_counter()
    rest = [coordinator.schedule(execution, args=(iterator,)) for _ in range(updates // steps - workers)]
    coordinator.join()
    seconds = time.perf_counter() - started
    timed = len(rest) * steps  # counted, not read from `optimizer.iterations`: that loses increments (below)
    stale = [tuple(int(v) for v in r.fetch()[:2]) for r in warm + rest]
    return {
        "workers": workers,
        "updates": len(warm + rest) * steps,
        # Keras's `iterations.assign_add` is a read-modify-write on the ps: two workers racing lose increments
        "iterations": int(optimizer.iterations.numpy()),
        "examples_per_sec": timed * batch / seconds,
        "timed_updates": timed,
        "timed_seconds": seconds,
        "staleness_mean": sum(s for s, _ in stale) / (len(stale) * steps),
        "staleness_max": max(m for _, m in stale),
        "loss_before": before,
        "loss_after": float(tf.reduce_mean(loss(y, model(x, training=False)))),
        "weights_sha256": weights_sha256(model.variables),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.machines.strategies.ps", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--updates", type=int, default=400, help="updates in all (a multiple of --steps)")
    parser.add_argument("--examples_per_update", type=int, default=64, help="towerflow's global batch / K")
    parser.add_argument("--steps", type=int, default=10, help="updates per scheduled function")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="", help="the chief's JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: PLC0415

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        serve(resolver)
        return
    if args.updates % args.steps or not args.out:
        parser.error("--updates: a multiple of --steps; --out: required on the chief")
    result = train(args.updates, args.examples_per_update, args.steps, args.seed)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
