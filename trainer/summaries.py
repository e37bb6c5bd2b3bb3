"""TensorBoard output: scalars, gradient/weight histograms, and the run's flags as hparams.

Tags are stable: a variable's tag comes from its position and its path with Keras's global layer counters
removed (`dense_3/kernel` -> `dense/kernel`), so two runs of the same model write the same tags whatever
else the process built before.
"""

from __future__ import annotations

import os
import re

import tensorflow as tf
from tensorboard.plugins.hparams import api as hp

_COUNTER = re.compile(r"_\d+(?=/|$)")


def variable_tags(variables) -> list[str]:
    """One stable tag per variable: `<index>_<path without layer counters>`."""
    return [f"{i:03d}_{_COUNTER.sub('', v.path)}" for i, v in enumerate(variables)]


class Summaries:
    """Event writers for `model_dir/train` and `model_dir/eval`."""

    def __init__(self, model_dir: str):
        self.train = tf.summary.create_file_writer(os.path.join(model_dir, "train"))
        self.eval = tf.summary.create_file_writer(os.path.join(model_dir, "eval"))

    def scalars(self, split: str, step: int, values: dict) -> None:
        """Writes each float in `values` (nested one level for per-tower lists) as a scalar."""
        writer = self.train if split == "train" else self.eval
        with writer.as_default(step=step):
            for name, value in values.items():
                if isinstance(value, (list, tuple)):
                    for i, item in enumerate(value):
                        tf.summary.scalar(f"{name}/tower_{i}", item)
                else:
                    tf.summary.scalar(name, value)
        writer.flush()

    def histograms(self, step: int, tags: list[str], gradients, variables) -> None:
        """Writes `gradients/<tag>` (averaged over micro-batches) and `weights/<tag>` histograms."""
        with self.train.as_default(step=step):
            for tag, grad, variable in zip(tags, gradients, variables, strict=True):
                tf.summary.histogram(f"gradients/{tag}", grad)
                tf.summary.histogram(f"weights/{tag}", variable.value)
        self.train.flush()

    def staleness(self, step: int, values) -> None:
        """Async: the histogram of the staleness of the updates of a window."""
        with self.train.as_default(step=step):
            tf.summary.histogram("staleness", tf.constant(values, tf.float32))

    def hparams(self, values: dict) -> None:
        """Records the run's flags with the hparams plugin (scalars, strings and bools as they are)."""
        clean = {k: (v if isinstance(v, (bool, int, float, str)) else str(v)) for k, v in values.items()}
        with self.train.as_default():
            hp.hparams(clean)
        self.train.flush()

    def close(self) -> None:
        self.train.close()
        self.eval.close()
