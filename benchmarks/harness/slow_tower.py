"""A benchmark-only slow tower: after each micro-batch of one tower, a host-side sleep of (factor - 1) x that
micro-batch's compute time, so the tower takes `factor` x as long, as a slower or busier GPU would.

Installed by the benchmark on a built mode (`install`), not a setting of the trainer. It wraps the mode's
micro-batch function (`Updater.wrap_micro_batch`: sync and async both call it under the tower's device scope,
when their step functions trace), so the delay sits in the same place in both modes: between the tower's last
gradient and whatever reads it. The values pass through `tf.identity` behind the sleep: the same bits.
"""

from __future__ import annotations

import time

import tensorflow as tf

from trainer.step.core import micro_batch as mb


def _same_device(a: str, b: str) -> bool:
    a, b = tf.DeviceSpec.from_string(a), tf.DeviceSpec.from_string(b)
    return (a.device_type, a.device_index) == (b.device_type, b.device_index)


def install(mode, tower: int, factor: float) -> None:
    """Slows `tower` of `mode` (a built sync or async updater, before its first step) by `factor` (> 1)."""
    mode.wrap_micro_batch(lambda inner: _slowed(inner, mode.placement.towers[tower], factor))


def _slowed(inner, device: str, factor: float):
    """`inner`, followed on `device` by a sleep of (factor - 1) x its own time."""

    def sleep(started):
        time.sleep((factor - 1.0) * (time.perf_counter() - float(started)))
        return 0.0

    def micro_batch(trainable, non_trainable, batch, loss_scale=None):
        leaves = tf.nest.flatten(batch)
        if not _same_device(tf.identity(leaves[0]).device, device):  # traced under another tower's scope
            return inner(trainable, non_trainable, batch, loss_scale)
        with tf.control_dependencies(leaves):
            started = tf.py_function(time.perf_counter, [], tf.float64)
        with tf.control_dependencies([started]):
            result = inner(trainable, non_trainable, batch, loss_scale)
        with tf.control_dependencies([result.loss, *result.grads]):
            slept = tf.py_function(sleep, [started], tf.float32)
        with tf.control_dependencies([slept]):
            return mb.MicroBatchResult(*tf.nest.map_structure(tf.identity, result.flat()))

    return micro_batch
