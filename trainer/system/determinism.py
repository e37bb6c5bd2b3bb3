"""Seeding and the switches of `--deterministic` (the determinism contract: docs/determinism.md)."""

from __future__ import annotations

import keras
import tensorflow as tf

# The public API has enable_op_determinism only; its counterpart lives here.
from tensorflow.python.framework import config as tf_framework_config


def configure(seed: int, deterministic: bool) -> None:
    """Seeds Python, numpy and TensorFlow; with `deterministic`, makes every op and the graph rewrite fixed.

    Grappler's arithmetic optimizer rewrites chains of adds differently when all inputs sit on one device, so
    with it on, one tower differs from two by one ulp in a few elements: deterministic mode turns it off,
    which keeps our micro-batch-ordered sums as written. Both settings are process-wide; a non-deterministic
    run turns them back to TensorFlow's defaults so runs in one process do not leak into each other.
    """
    keras.utils.set_random_seed(seed)
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    elif tf_framework_config.is_op_determinism_enabled():
        tf_framework_config.disable_op_determinism()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": not deterministic})
