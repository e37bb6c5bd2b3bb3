"""Helpers shared by the data tests."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import data


def _images(n: int, height: int, width: int, channels: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, height, width, channels), dtype=np.uint8)


def _write_ids(tmp_path, num_examples: int = 40, num_shards: int = 4, name: str = "ids") -> list[str]:
    """Dense records whose feature[0] is the example's id, so tests can tell examples apart."""
    ids = np.arange(num_examples, dtype=np.float32)
    features = np.stack([ids, ids * 0.5], axis=1)
    return data.write_dense_records(str(tmp_path / name), features, ids.astype(np.int64) % 7, num_shards=num_shards)


def _collect(dataset: tf.data.Dataset, num_batches: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    batches = list(dataset.take(num_batches) if num_batches else dataset)
    features = np.concatenate([x.numpy() for x, _ in batches])
    labels = np.concatenate([y.numpy() for _, y in batches])
    return features, labels


def _count_records(pattern: str) -> int:
    return sum(1 for _ in tf.data.TFRecordDataset(list(data.list_files(pattern))))


def token_records(pattern: str) -> list[list[int]]:
    """Every record's `tokens` (the language model's records, data/text.py), files in sorted order."""
    import glob  # noqa: PLC0415

    records = []
    for path in sorted(glob.glob(pattern)):
        for raw in tf.data.TFRecordDataset(path):
            example = tf.io.parse_single_example(raw, {"tokens": tf.io.VarLenFeature(tf.int64)})
            records.append(tf.sparse.to_dense(example["tokens"]).numpy().tolist())
    return records
