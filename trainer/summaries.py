"""TensorBoard output: scalars, gradient/weight histograms, and the run's flags as hparams.

Tags are stable: a variable's tag comes from its position and its path with Keras's global layer counters
removed (`dense_3/kernel` -> `dense/kernel`), so two runs of the same model write the same tags whatever
else the process built before.
"""

from __future__ import annotations

import functools
import os
import re

import tensorflow as tf
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.histogram import metadata as histogram_metadata
from tensorboard.plugins.hparams import api as hp

_COUNTER = re.compile(r"_\d+(?=/|$)")


def variable_tags(variables) -> list[str]:
    """One stable tag per variable: `<index>_<path without layer counters>`."""
    return [f"{i:03d}_{_COUNTER.sub('', v.path)}" for i, v in enumerate(variables)]


def purge_events(model_dir: str, after_step: int) -> int:
    """Drops, from the event files of model_dir/train and model_dir/eval, every event past `after_step` and
    every hparams record, so that a resumed run's steps stay strictly increasing per tag and its settings are
    recorded once (the resumed run writes them anew). Returns how many events past `after_step` it dropped.

    Files are rewritten only when they hold such events, each to a temporary file then renamed over the
    original: a kill in between leaves the old file or the new one, never half of either.
    """
    dropped = 0
    for path in sorted(tf.io.gfile.glob(os.path.join(model_dir, "*", "events.out.tfevents.*"))):
        if path.endswith(".purging"):
            continue
        events = [event_pb2.Event.FromString(r.numpy()) for r in tf.data.TFRecordDataset(path)]
        keep = [e for e in events if not _purged(e, after_step)]
        if len(keep) == len(events):
            continue
        with tf.io.TFRecordWriter(path + ".purging") as writer:
            for event in keep:
                writer.write(event.SerializeToString())
        tf.io.gfile.rename(path + ".purging", path, overwrite=True)
        dropped += sum(1 for e in events if e.step > after_step)
    return dropped


def _purged(event, after_step: int) -> bool:
    if event.step > after_step:
        return True
    return any(v.metadata.plugin_data.plugin_name == "hparams" for v in event.summary.value)


def histogram_buckets(values, bucket_count: int = 30):
    """TensorBoard's histogram tensor: [bucket_count, 3] rows of (left edge, right edge, count), all in the
    last bucket when every value is the same; counted with `bincount` instead of a one-hot."""
    values = tf.reshape(tf.cast(values, tf.float64), [-1])
    low, high = tf.reduce_min(values), tf.reduce_max(values)
    width = (high - low) / bucket_count
    index = tf.where(width > 0, tf.floor((values - low) / tf.where(width > 0, width, 1.0)), bucket_count - 1)
    index = tf.minimum(tf.cast(index, tf.int32), bucket_count - 1)
    counts = tf.math.bincount(index, minlength=bucket_count, maxlength=bucket_count, dtype=tf.float64)
    edges = tf.concat([tf.linspace(low, high, bucket_count + 1)[:-1], [high]], 0)
    left = tf.where(width > 0, edges[:-1], tf.fill([bucket_count], high))
    right = tf.where(width > 0, edges[1:], tf.fill([bucket_count], high))
    return tf.transpose(tf.stack([left, right, counts]))


def _histogram(tag: str, values) -> None:
    metadata = histogram_metadata.create_summary_metadata(display_name=None, description="")
    tf.summary.write(tag, histogram_buckets(values), metadata=metadata)


class Summaries:
    """Event writers for `model_dir/train` and `model_dir/eval`."""

    def __init__(self, model_dir: str, tower_tags: list[str] | None = None):
        self.tower_tags = tower_tags  # names of the per-tower scalars; None: tower_<i>
        self.train = tf.summary.create_file_writer(os.path.join(model_dir, "train"))
        self._histogram_fns: dict = {}  # graph-built histogram writers, one per list of tags
        self.eval = tf.summary.create_file_writer(os.path.join(model_dir, "eval"))

    def scalars(self, split: str, step: int, values: dict) -> None:
        """Writes each float in `values` (nested one level for per-tower lists) as a scalar."""
        writer = self.train if split == "train" else self.eval
        with writer.as_default(step=step):
            for name, value in values.items():
                if isinstance(value, (list, tuple)):
                    for i, item in enumerate(value):
                        tag = self.tower_tags[i] if self.tower_tags else f"tower_{i}"
                        tf.summary.scalar(f"{name}/{tag}", item)
                else:
                    tf.summary.scalar(name, value)
        writer.flush()

    def histograms(self, step: int, tags: list[str], gradients, variables) -> None:
        """Writes `gradients/<tag>` (averaged over micro-batches) and `weights/<tag>` histograms.

        One graph call per histogram step, buckets counted with `bincount` on the host CPU (deterministic on
        every device): TensorBoard's eager `tf.summary.histogram` costs hundreds of small eager ops and a
        [size x 30] float64 one-hot per tensor (about 9 step times of the cnn per histogram step, against
        about 1 for this)."""
        key = tuple(tags)
        if key not in self._histogram_fns:
            self._histogram_fns[key] = tf.function(functools.partial(self._write_histograms, key))
        self._histogram_fns[key](tf.constant(step, tf.int64), list(gradients), list(variables))

    def _write_histograms(self, tags, step, gradients, variables) -> None:
        with self.train.as_default(step=step), tf.device("/device:CPU:0"):
            for tag, grad, variable in zip(tags, gradients, variables, strict=True):
                _histogram(f"gradients/{tag}", grad)
                _histogram(f"weights/{tag}", variable)

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
