"""The input of a side, inside a worker: the records as a DataConfig, or the same batches held in memory.

Every in-memory side of a setting gets identical batches: the first batches of the normal training
pipeline (same seed), decoded once and stacked, then served by slicing one whole batch per step. No
per-example tf.data work is left, so the step, not the input, is what the memory sides time.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import tensorflow as tf

import data
from benchmarks.harness.plan import Setting
from trainer.settings.config import DataConfig

# Enough batches to hold the whole digits train set (1437 / 128) and 2048 synthetic examples at batch 64;
# every memory side cycles through them.
_MAX_BATCHES = 32
_SEED = 0


def data_config(setting: Setting, records: dict, augment: str = "none") -> DataConfig:
    """The records of `setting` (globs found by the parent) as towerflow's DataConfig. No augmentation unless
    asked: the memory sides hold unaugmented batches, and tfrecord_vs_memory compares reading with not reading."""
    return DataConfig(
        train_data=records["train"], eval_data=records["eval"], num_classes=setting.num_classes, augment=augment
    )


@functools.lru_cache(maxsize=4)
def memory_batches(train_glob: str, global_batch_size: int, num_examples: int) -> tuple[np.ndarray, np.ndarray]:
    """Decoded global batches from the normal training pipeline: features [n, B, ...], labels [n, B]."""
    num_batches = min(_MAX_BATCHES, max(1, math.ceil(num_examples / global_batch_size)))
    info = data.inspect_records(train_glob)
    dataset = data.make_dataset(info, batch_size=global_batch_size, training=True, seed=_SEED)
    features, labels = zip(*((x.numpy(), y.numpy()) for x, y in dataset.take(num_batches)), strict=True)
    return np.stack(features), np.stack(labels)


def memory_dataset(setting: Setting, records: dict, batch_size: int) -> tf.data.Dataset:
    """The memory batches, re-cut to `batch_size` (a divisor of the global batch: async towers read
    micro-batches), repeated forever."""
    features, labels = memory_batches(records["train"], setting.global_batch_size, setting.num_examples)
    features = features.reshape(-1, batch_size, *features.shape[2:])
    labels = labels.reshape(-1, batch_size)
    return tf.data.Dataset.from_tensor_slices((features, labels)).repeat()
