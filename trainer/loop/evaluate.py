"""Evaluation: the task's loss and metrics over the whole eval set, each batch cut into the run's K parts."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from data.options import with_run_options
from models import vocab_shards
from trainer.step.core import micro_batch as tw
from trainer.step.core import tree
from trainer.system import graphs
from trainer.system.devices import Placement, tower_of_micro_batch


class Evaluator:
    """Runs the model in inference mode over every eval example once.

    Each batch is cut into K near-equal parts, K the run's micro-batches (the last batch may be short, so the
    parts may differ by one example), and part j is scored on tower j*N//K, as micro-batch j trains there; the
    task's sums of the K parts are added along the fixed tree over part indices (`trainer.step.core.tree`) on
    the parameter device, the batches' sums in the eval data's order, and divided once at the end: the loss by
    the total weight (every real token or example once), each metric's sum by its count. A part holds the
    same examples and runs the same ops whatever N is (as a micro-batch does), and its sums are added in the
    same order, so the eval figures are the same bits on any number of towers or machines at fixed K
    (docs/determinism.md); cut by N, a part's shape, and with it the forward's and the sums' rounding,
    followed the layout.

    Args:
      task: the run's `tasks.Task` (its loss, metrics and `eval_metrics`).
      model: its Keras model.
      placement: tower and parameter devices.
      make_dataset: () -> finite dataset of batches.
      explain: error -> the exception to raise instead (e.g. a `data.DataError` naming a bad eval record), or
        None to raise the error itself; called when evaluating raises a `tf.errors.OpError`.
      forward: (tower, model inputs) -> the model's outputs for tower `tower`'s part, in inference mode
        (`trainer.step.sync.runners.inference`: through pipeline stages or whole); None: the whole model there.
      num_parts: K, the parts each batch is cut into (the run's micro-batches); 0: one per tower.
      num_examples: the eval records counted before training (what an eval's progress counts up to), or None.
    """

    def __init__(
        self,
        task,
        model,
        placement: Placement,
        make_dataset,
        explain=None,
        forward=None,
        num_parts=0,
        num_examples=None,
    ):
        self.num_examples = num_examples
        self.task = task
        self.num_parts = num_parts or (len(placement.towers) if placement else 0)
        self.model = model
        self.forward = forward or (lambda tower, inputs: model(inputs, training=False))
        self.placement = placement
        self.make_dataset = make_dataset
        self.explain = explain or (lambda error: None)
        self._eval_fn = graphs.function(self._batch_sums)

    def evaluate(self, should_stop=None, progress=None) -> dict | None:
        """Returns {"eval_loss", "eval_<metric>" for each of the task's metrics, "eval_examples", and what the
        task's `eval_metrics` adds} as Python numbers, or None when `should_stop()` turned true between two
        batches (a stop request does not wait for a long eval). `progress(examples)` is told the examples
        scored so far after every batch.

        Raises:
          What `explain` makes of a `tf.errors.OpError` (the eval data's own failures surface here).
        """
        try:
            return self._evaluate(should_stop, progress or (lambda examples: None))
        except tf.errors.OpError as e:
            explained = self.explain(e)
            if explained is None:
                raise
            raise explained from e

    def _evaluate(self, should_stop, progress) -> dict | None:
        totals, count = None, 0
        for batch in self._batches():
            if should_stop is not None and should_stop():
                return None
            sums = tf.nest.map_structure(float, self._eval_fn(batch))
            totals = sums if totals is None else tf.nest.map_structure(lambda a, b: a + b, totals, sums)
            count += tw.batch_size(batch)
            progress(count)
        if count == 0:
            raise ValueError("the eval data holds no examples")
        (loss, weight), metrics = totals
        values = {"loss": loss / weight if weight else None, **tw.metric_values(metrics)}
        values.update(self.task.eval_metrics(values))
        return {**{f"eval_{name}": value for name, value in values.items()}, "eval_examples": count}

    def predictions(self) -> tuple[list, list]:
        """The model's outputs (float32) and the batches of every eval batch, as numpy nests, in the eval data's
        order: the outputs `evaluate` scores (the same towers, split and graph). For checking what serves
        against what was evaluated."""
        outputs_fn = graphs.function(self._batch_outputs)
        outputs, batches = [], []
        for batch in self._batches():
            outputs.append(tf.nest.map_structure(np.asarray, outputs_fn(batch)))
            batches.append(tf.nest.map_structure(np.asarray, batch))
        return outputs, batches

    def _batches(self) -> tf.data.Dataset:
        """The eval data, under the options of every pipeline the engine iterates (`data.options`)."""
        return with_run_options(self.make_dataset())

    def _batch_sums(self, batch):
        """((loss sum, weight), {name: (sum, count)}) of one batch, its K parts' sums along the tree."""
        losses, weights, metrics = [], [], []
        for device, outputs, part in self._part_outputs(batch):
            outputs = vocab_shards.for_task(self.task, self.model, outputs)
            with tf.device(device):
                loss, weight = tw.weighted_sums(self.task, outputs, part)
                losses.append(loss)
                weights.append(weight)
                metrics.append(tw.task_metrics(self.task, outputs, part))
        with tf.device(self.placement.parameter_device):
            sums = {
                name: (tree.tree_sum([m[name][0] for m in metrics]), tree.tree_sum([m[name][1] for m in metrics]))
                for name in self.task.metric_names
            }
            return (tree.tree_sum(losses), tree.tree_sum(weights)), sums

    def _batch_outputs(self, batch):
        parts = [outputs for _, outputs, _ in self._part_outputs(batch)]
        with tf.device(self.placement.host):
            return tf.nest.map_structure(lambda *xs: tf.concat(xs, axis=0), *parts)

    def _part_outputs(self, batch) -> list[tuple[str, object, object]]:
        """(tower, outputs float32, the part) of each of the batch's K parts, in part order: part j on tower
        j*N//K (with pipeline stages, `forward` sends that tower's parts to pipeline j*P//K, as the step does)."""
        towers, k = self.placement.towers, self.num_parts
        with tf.device(self.placement.host):
            size = tf.shape(tf.nest.flatten(batch)[0])[0]
            sizes = size // k + tf.cast(tf.range(k) < size % k, tf.int32)
            pieces = [tf.split(x, sizes, num=k) for x in tf.nest.flatten(batch)]
        parts = []
        for j in range(k):
            tower = tower_of_micro_batch(j, k, len(towers))
            part = tf.nest.pack_sequence_as(batch, [p[j] for p in pieces])
            with tf.device(towers[tower]):
                outputs = self.forward(tower, self.task.model_inputs(part))
                parts.append((towers[tower], tf.nest.map_structure(tw.float32, outputs), part))
        return parts
