"""The run's input: which records, and the pipelines that read them where they are used.

Training reads K streams, one per micro-batch index: stream j reads a fixed share of the files (seeded like
every stream) and yields micro-batch j of every step. What micro-batch j holds therefore depends on neither
the number of towers nor the number of machines, and each stream is read on the CPU of the task whose tower
runs micro-batch j, so the global batch never crosses the network. Async mode reads one stream per tower.

Eval reads on the chief and splits each batch across every tower (`trainer.loop.evaluate`).

Nothing here decides anything: which tower reads each stream is the update mode's answer
(`UpdateMode.stream_towers`, from the run's `Plan`), and the cache and preprocessing are the run's
`DataSettings` (`trainer.settings.preprocess.data_settings`), both passed in.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

import data
from data.options import with_run_options
from trainer.settings.config import DataConfig, RunConfig
from trainer.step.modes import Plan
from trainer.system import graphs
from trainer.system.devices import Placement


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The resolved train and eval records."""

    train: data.RecordInfo
    eval: data.RecordInfo
    num_classes: int


def resolve_inputs(config: DataConfig) -> Inputs:
    """Finds the records (building the digits cache when no --train_data is given) and reads their shape.

    Raises:
      data.DataError: no files, unreadable records, train and eval records of different shapes.
    """
    if config.train_data:
        train_pattern, eval_pattern, num_classes = config.train_data, config.eval_data, config.num_classes
    else:
        train_pattern, eval_pattern = data.ensure_digits()
        num_classes = 10
    schema = _schema(config)
    train = data.inspect_records(train_pattern, schema, what="--train_data")
    evaluation = data.inspect_records(eval_pattern, train.schema, what="--eval_data")
    if evaluation.example_shape != train.example_shape:
        raise data.DataError(
            f"--eval_data examples have shape {evaluation.example_shape} but --train_data examples have "
            f"{train.example_shape}; pass --image_size=H,W to resize both"
        )
    return Inputs(train, evaluation, num_classes)


def _schema(config: DataConfig):
    if config.record_schema == "dense":
        return data.DenseSchema(config.feature_key, config.label_key, config.label_offset)
    if config.record_schema == "image" or config.label_offset or config.image_size:
        return data.ImageSchema(config.label_offset, config.image_size)
    return None  # auto: the first record decides


class PlacedIterator:
    """An input stream made on `device` (possibly another machine's CPU), resumable from a tiny position.

    `make_dataset(position)` builds the stream from an (epoch, record) position, yielding (batch, position
    after the batch) (`trainer.loop.records`); a plain `tf.data.Dataset` of batches may stand in for it. The
    step that consumes a batch stores its position in `position`, a variable on the stream's device that the
    checkpoint saves (only it, not the iterator): 16 bytes per stream instead of the tf.data iterator's state,
    whose shuffle buffer is ~1 GB for ImageNet records. After a restore, `restart()` rebuilds the stream at the
    restored position; it resumes exactly.

    A dataset without positions (benchmarks' in-memory data) yields batches; it restarts from its beginning.
    Whatever the dataset, it runs under `data.options.with_run_options`: a stream lives for the whole run, and
    with tf.data's autotuning model its deletion would wait out the model's sleep, up to a minute (docs/facts.md).
    """

    def __init__(self, make_dataset, device: str, position_size: int = 2):
        self.device = device
        self._positioned = not isinstance(make_dataset, tf.data.Dataset)
        if not self._positioned:  # a fixed dataset: restarts from its beginning
            dataset = make_dataset
            make_dataset = lambda position: dataset  # noqa: E731
        self._make_dataset = make_dataset
        with tf.device(device):
            self.position = tf.Variable([0] * position_size, dtype=tf.int64, trainable=False, name="position")
        self.restart()

    def restart(self) -> None:
        """(Re)builds the stream at `position`."""
        position = tuple(int(v) for v in self.position.numpy())
        # On another task's host the iterator is made by remote eager ops, which run asynchronously: a step
        # could reach that host first and read an iterator not yet made ("GetNext() failed because the iterator
        # has not been initialized", seen once in a 2-task run on a loaded machine). The scope's end waits for
        # every executor, local and remote (`sync_executors`).
        with tf.device(self.device), tf.experimental.async_scope():
            self.iterator = iter(with_run_options(graphs.pipelines(self._make_dataset)(position)))
        spec = self.iterator.element_spec
        self.element_spec = spec[0] if self._positioned else spec  # of one batch

    def take(self, iterator):
        """The next batch of `iterator` (this stream's, passed into a `tf.function`), recording the position
        after it; call under `tf.device(self.device)`."""
        element = next(iterator)
        if not self._positioned:
            return element
        self.position.assign(element[1])
        return element[0]

    def __next__(self):
        with tf.device(self.device):
            return self.take(self.iterator)

    def __iter__(self):
        return self


def train_iterators(plan: Plan, placement: Placement, reader, inputs: Inputs, train_dataset, bad_records, settings):
    """Sync: K streams of micro-batches, stream j on the host of micro-batch j's tower. Async: one stream per
    tower, on its host. Every stream reads its own share of the files, so no example is read twice per epoch.

    `reader` reads the task's records (`trainer.loop.records`). `train_dataset` (benchmarks) replaces the
    records: it must yield micro-batches and is iterated per stream.
    """
    config = plan.config
    t = config.towers
    towers = plan.mode.stream_towers(config, len(placement.towers))
    hosts = [placement.host_of(tower) for tower in towers]
    if train_dataset is not None:  # no positions: restarts from its beginning
        return [PlacedIterator(train_dataset, host) for host in hosts]
    iterators = []
    for j, host in enumerate(hosts):
        share = dict(worker_index=j, num_workers=len(hosts), bad_records=bad_records)
        with tf.device(host):  # decoded once (--cache), on the stream's host, and kept across its rebuilds
            decoded = graphs.pipelines(reader.decode_share)(inputs, settings, share)
        stream = data.Stream(
            batch_size=t.micro_batch_size,
            seed=config.seed,
            shuffle_buffer=max(1, config.data.shuffle_buffer // len(hosts)),
            **share,
            **reader.stream_settings(inputs, settings),
        )
        iterators.append(PlacedIterator(reader.stream(inputs, stream, decoded), host, reader.position_size))
    return iterators


def eval_dataset_fn(config: RunConfig, reader, inputs: Inputs, bad_records: data.BadRecords, settings):
    """() -> the eval dataset: every eval record once, in order, in batches of --eval_batch_size, read by
    `reader` (for images through the run's preprocessing: for imagenet the center crop; never random)."""
    eval_batch = config.data.eval_batch_size or config.towers.global_batch_size
    extra = reader.stream_settings(inputs, settings)

    def make_dataset():
        return reader.eval_dataset(inputs, data.Stream(eval_batch, bad_records=bad_records, **extra))

    return graphs.pipelines(make_dataset)
