"""The language model's sides, inside a worker: towerflow's `--task=lm` and its Keras `fit` peer on the same
model (`models.transformer.transformer_lm`), the same batches in memory and the same optimizer.

Both sides read the first batches of the task's own training pipeline (`data.feature_training_dataset`, seed
0), padded to the records' length and held in memory. towerflow gets them as the task's dicts (`tokens`,
`tokens_length`), cut into micro-batches; Keras gets `((ids, lengths), targets, mask)`, the model's inputs,
the next tokens and the padding as `sample_weight`, with `SparseCategoricalCrossentropy(from_logits=True)` and
accuracy as a weighted metric: the loss over padded targets as Keras's documentation writes it. The throughput
reported is examples (sequences) per second; tokens per second is that times the setting's context.
"""

from __future__ import annotations

import dataclasses
import functools

import keras
import numpy as np
import tensorflow as tf

import data
import tasks
from benchmarks.harness import mfu, reference
from benchmarks.harness.plan import Setting, Side
from benchmarks.harness.sides import TowerflowSide, run_config
from data import text as text_data
from trainer.settings.config import DataConfig, RunConfig, TaskConfig

_MAX_BATCHES = 32  # as inputs.py: 32 global batches of 32 windows, 1024 of the 6541
TOKENS, LENGTHS = text_data.TOKENS_KEY, text_data.TOKENS_KEY + "_length"


def task_config(setting: Setting) -> TaskConfig:
    """The setting's task at the task's default sizes but for its width (`Setting.width`), its context from the
    records' length."""
    options = {"context": setting.example_shape[0] - 1, **({"width": setting.width} if setting.width else {})}
    return TaskConfig(name=setting.task, options=options)


def make_task(setting: Setting, records: dict) -> tasks.Task:
    """The task as towerflow makes it, reading the setting's records."""
    return tasks.make_task(RunConfig(data=DataConfig(train_data=records["train"]), task=task_config(setting)))


@functools.lru_cache(maxsize=2)
def memory_batches(setting: Setting, train_glob: str) -> tuple[np.ndarray, np.ndarray]:
    """The first global batches of the task's pipeline: tokens int32 [n, B, length], lengths int32 [n, B]
    (a batch padded to a shorter bucket is padded on to the records' length, so all stack)."""
    task = make_task(setting, {"train": train_glob})
    info = data.inspect_feature_records(train_glob, data.FeatureSchema.of(task.features(), task.name))
    stream = data.Stream(batch_size=setting.global_batch_size, seed=0)
    dataset = data.feature_training_dataset(info, stream, task.preprocess)
    num_batches = min(_MAX_BATCHES, max(1, setting.num_examples // setting.global_batch_size))
    tokens, lengths = [], []
    for batch in dataset.take(num_batches):
        ids = batch[TOKENS].numpy()
        tokens.append(np.pad(ids, [(0, 0), (0, setting.example_shape[0] - ids.shape[1])]))
        lengths.append(batch[LENGTHS].numpy())
    return np.stack(tokens), np.stack(lengths)


def towerflow_dataset(setting: Setting, records: dict, batch_size: int) -> tf.data.Dataset:
    """The memory batches as the task's dicts, re-cut to `batch_size` (the micro-batch), repeated forever."""
    tokens, lengths = memory_batches(setting, records["train"])
    cut = {TOKENS: tokens.reshape(-1, batch_size, tokens.shape[-1]), LENGTHS: lengths.reshape(-1, batch_size)}
    return tf.data.Dataset.from_tensor_slices(cut).repeat()


def keras_batches(tokens: np.ndarray, lengths: np.ndarray) -> tuple:
    """((ids, lengths), targets, mask) of records `tokens` [..., T + 1] of true `lengths` [...]: the model sees
    tokens[:-1] and predicts tokens[1:]; mask is 1.0 where the target is real (position < length - 1)."""
    targets = tokens[..., 1:]
    mask = (np.arange(targets.shape[-1]) < (lengths - 1)[..., None]).astype(np.float32)
    return (tokens[..., :-1], lengths - 1), targets, mask


def keras_dataset(setting: Setting, records: dict) -> tf.data.Dataset:
    """The same global batches as Keras's `fit` takes them (`keras_batches`), repeated forever."""
    tokens, lengths = memory_batches(setting, records["train"])
    return tf.data.Dataset.from_tensor_slices(keras_batches(tokens, lengths)).repeat()


class LmTowerflowSide(TowerflowSide):
    """towerflow training the task on the memory batches (or its records, for an input="tfrecord" side)."""

    def config_and_dataset(self, side: Side, setting: Setting, records: dict, model_dir: str):
        config = run_config(side, setting, records, model_dir)
        # No --train_data for char tokens: the task's default corpus, the records `records` names
        # (records.ensure_records); other tokens are records of that corpus the task does not default to.
        data_config = DataConfig()
        if setting.data != "pydoc":
            data_config = DataConfig(train_data=records["train"], eval_data=records["eval"])
        config = dataclasses.replace(config, data=data_config, task=task_config(setting))
        dataset = None
        if side.input == "memory":
            dataset = towerflow_dataset(setting, records, config.towers.micro_batch_size)
        self.task = make_task(setting, records)
        return config, dataset

    def stats(self) -> dict:
        """The async staleness (if any), and its sizes and TensorFlow's matmul peak for MFU (mfu.py)."""
        return {**super().stats(), **model_stats(self.task, self.trainer.model.count_params())}


class LmKerasFitSide(reference.KerasFitSide):
    """Keras `fit` of the same Transformer: logits out, the padded targets' loss weighted by the mask."""

    def __init__(self, setting: Setting, records: dict, num_devices: int, steps_per_execution: int, accuracy: bool):
        self.task = make_task(setting, records)
        super().__init__(setting, keras_dataset(setting, records), num_devices, steps_per_execution, accuracy)

    def compiled(self, setting: Setting, accuracy: bool, steps_per_execution: int) -> keras.Model:
        model, optimizer = reference.model_and_optimizer(setting, self.task.build_model)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        weighted = ["accuracy"] if accuracy else []
        model.compile(optimizer, loss, weighted_metrics=weighted, steps_per_execution=steps_per_execution)
        return model

    def stats(self) -> dict:
        return model_stats(self.task, self.model.count_params())


def model_stats(task: tasks.Task, parameters: int) -> dict:
    """`mfu.side_stats` of the task's model, with TensorFlow's matmul peak measured now."""
    return mfu.side_stats(task.vocab_size, task.layers, task.width, task.context, parameters, mfu.tensorflow_peak)


def make_side(side: Side, setting: Setting, records: dict, work_dir: str):
    """A side of a task setting: "towerflow" or "keras_fit" (the only references written for a task; its peers
    are `benchmarks.harness.peers`', which builds on this module).

    Raises:
      ValueError: another kind of side.
    """
    if side.kind == "towerflow":
        return LmTowerflowSide(side, setting, records, f"{work_dir}/model")
    if side.kind == "keras_fit":
        return LmKerasFitSide(setting, records, side.towers, side.steps_per_execution, side.keras_accuracy)
    raise ValueError(f"setting {setting.name} (task {setting.task}) has no {side.kind!r} side: towerflow or keras_fit")
