"""The tf.data options of every pipeline towerflow iterates: the training and eval streams
(`data.pipeline.finished`, and again where the engine iterates them, whatever made the dataset:
`trainer.loop.inputs.PlacedIterator`, `trainer.loop.evaluate`), the benchmarks' reference sides, and the eager
reads of records (the decoded cache's build, the record checks, `data.inspect`, the TensorBoard event files a
resume cuts back: `trainer.outputs.event_files`)."""

from __future__ import annotations

import tensorflow as tf


def with_run_options(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` in a fixed order and without tf.data's autotuning model.

    With the model, deleting an iterator waits for the model's thread: 30-80 s at a time on a busy 2-core
    machine (docs/facts.md), landing wherever Python collects the iterator, in a later step or test. Without
    it each AUTOTUNE map runs one call per core and prefetch grows its own buffer; throughput measured the same
    (benchmarks.harness.inputs, tfrecord_vs_memory)."""
    options = tf.data.Options()
    options.deterministic = True
    # Reading training files writes bad_records' table, which the run checkpoints itself; without IGNORE,
    # saving the iterator refuses a pipeline with such stateful ops.
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    options.autotune.enabled = False
    return dataset.with_options(options)
