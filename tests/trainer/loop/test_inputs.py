"""What the engine iterates runs under `data.options.with_run_options`, whatever made the dataset.

With tf.data's autotuning model, deleting an iterator waits out the model thread's sleep, which doubles as the
iterator lives (docs/facts.md: 2.5-82 s in trainer/step's tests when plain datasets were handed to the engine).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import data
from tests.support.records import _images
from trainer.loop.evaluate import Evaluator
from trainer.loop.inputs import PlacedIterator

pytestmark = pytest.mark.quick


def _autotuned(dataset: tf.data.Dataset) -> bool:
    return dataset.options().autotune.enabled is not False  # None: tf.data's default, which is on


def test_a_plain_dataset_given_to_the_engine_is_streamed_without_the_autotuning_model():
    plain = tf.data.Dataset.range(3).repeat()
    assert _autotuned(plain)
    stream = PlacedIterator(plain, "/cpu:0")
    assert not _autotuned(stream.iterator._dataset)
    assert [int(next(stream)) for _ in range(5)] == [0, 1, 2, 0, 1]  # the same elements, in order
    stream.restart()
    assert not _autotuned(stream.iterator._dataset)
    assert int(next(stream)) == 0


def test_eval_data_from_any_maker_is_read_without_the_autotuning_model():
    evaluator = Evaluator(task=None, model=None, placement=None, make_dataset=lambda: tf.data.Dataset.range(2))
    batches = evaluator._batches()
    assert not _autotuned(batches)
    assert [int(x) for x in batches] == [0, 1]


def test_towerflows_own_pipelines_run_without_the_autotuning_model(tmp_path):
    data.write_image_records(str(tmp_path / "img"), _images(8, 4, 4, 1), np.arange(8) % 2, num_shards=1)
    info = data.inspect_records(str(tmp_path / "img-*"))
    for training in (True, False):
        assert not _autotuned(data.make_dataset(info, batch_size=4, training=training))
