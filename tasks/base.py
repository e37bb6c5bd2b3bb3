"""`Task`: the one seam between the engine and a workload.

A task says what its records hold, how one example is prepared, which model it trains, what each example
(or token) costs, what it measures and what its served model takes. The engine owns everything else: the
order of the records, the towers, the fixed-order sums, the update, checkpoints, summaries and export.

What the engine guarantees a task (docs/tasks.md):

- `loss` returns one loss per example (or per token) and a weight for each. The engine sums `loss * weight`
  and `weight` over each micro-batch, adds the micro-batches along its fixed tree, and divides once by the
  global sum of weights. A task never divides by a batch size; a weight of 0 (padding) never counts; the loss
  and the gradient are the same for any number of towers, machines or micro-batches (at a fixed number K of
  micro-batches, bit for bit).
- `metrics` returns sums and counts; the engine adds them the same way and reports `sum / count`.
- `preprocess` is called once per example with a seed made from the run's seed and the example's position in
  its stream (epoch, record), never from the tower that will run it: the same example gets the same draws on
  every layout, and after a resume.
- A variable-length feature (`Feature.max_length > 0`) reaches the model padded with `Feature.pad` to a
  length from `Feature.buckets`, the same for every example of a micro-batch; its true lengths arrive as
  `batch[name + "_length"]` (int32, [batch]); the model sees the padded positions (mask them: docs/tasks.md).
  A record longer than `max_length`, lacking a key (unless `Feature.optional`) or holding a value outside
  `Feature.bounds` fails the run with a line that names the task, the feature and the file.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from data.schema import Feature


class Task:
    """Subclass it and name the subclass with `--task=package.module:Class`.

    The constructor takes the run's settings (`trainer.settings.config.RunConfig`): a task reads its own
    options from `config.task.arg_dict` (`--task_args=key=value,...`, strings), the seed from `config.seed`.

    Attributes:
      name: Shown in the banner, `run.json` and error messages.
      metric_names: The keys `metrics` returns, in the order logs show them.
      eval_metric: The eval metric HParams ranks runs by (one of `metric_names`, or "loss").
      records: The kind of records, which chooses how the engine reads them: "features" (by `features()` and
        `preprocess`, the default) or "labeled" (images and vectors with class labels through the built-in
        pipeline and its serving signatures; the task has `bind(example_shape, num_classes)` and a model of class
        logits, as `tasks.classify.Classify`).
      vocabulary_shards: True when `loss`, `metrics` and `serving` take the logits of a head split by vocabulary
        as they come, a tuple of shards (through `models.vocab_shards`' `cross_entropy`, `argmax` and `whole`, as
        the built-in language model does); False (the default): the engine gathers them into whole logits first.
    """

    name = "task"
    metric_names: tuple[str, ...] = ()
    eval_metric = "loss"
    records = "features"
    vocabulary_shards = False
    # Keys of `describe()` the model's weights are made for (a vocabulary): a resume whose data changes one is
    # refused, even with --allow_flag_changes, since the checkpoint's weights cannot serve the new records.
    model_facts: tuple[str, ...] = ()

    def __init__(self, config):
        self.config = config

    # --- records ---------------------------------------------------------------------------------------------

    def features(self) -> dict[str, Feature]:
        """The record schema: each tf.train.Example key this task reads, with its dtype and shape."""
        raise NotImplementedError(f"{type(self).__name__}.features")

    def preprocess(self, example: dict[str, tf.Tensor], seed: tf.Tensor, training: bool) -> dict[str, tf.Tensor]:
        """One parsed example -> the tensors a batch holds (before padding). `seed` is an int32 [2] stateless
        seed (for `tf.random.stateless_*`), the example's own. Default: the example as parsed."""
        del seed, training
        return example

    def default_data(self) -> tuple[str, str] | None:
        """(train, eval) file patterns used when no --train_data is given, made on this machine without a
        download (the default corpus); None: --train_data is required."""
        return None

    # --- model and objective ---------------------------------------------------------------------------------

    def build_model(self) -> keras.Model:
        """The model, built (its variables exist). Weights come from Keras's seeded global RNG."""
        raise NotImplementedError(f"{type(self).__name__}.build_model")

    def model_inputs(self, batch: dict[str, tf.Tensor]):
        """What the model is called on, from a batch. Default: the whole batch."""
        return batch

    def loss(self, outputs, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        """(losses, weights) of one micro-batch, float32 tensors of the same shape: one loss per example (or
        per token) and its weight (0 for padding). Never divided by a batch size: the engine does that, once."""
        raise NotImplementedError(f"{type(self).__name__}.loss")

    def metrics(self, outputs, batch: dict[str, tf.Tensor]) -> dict[str, tuple[tf.Tensor, tf.Tensor]]:
        """{name: (sum, count)} of one micro-batch; reported as sum / count over the whole batch (or eval set).
        Default: none beyond the loss."""
        del outputs, batch
        return {}

    def eval_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        """Extra eval figures derived from the eval totals ({"loss": per weight, name: sum / count, ...}).
        Default: none."""
        del totals
        return {}

    # --- serving ---------------------------------------------------------------------------------------------

    def serving(self, model: keras.Model) -> dict[str, tuple[object, list[tf.TensorSpec]]]:
        """The SavedModel's signatures: {name: (function of the specs' tensors -> dict of outputs, specs)}; the
        first is also `serving_default`. A function that is a method of a `tf.Module` has the module saved with
        it (its resources: a lookup table, a tokenizer). Default: none, and then a run needs --noexport (refused
        at the start)."""
        del model
        return {}

    def named_model(self) -> str | None:
        """The name the task builds its model by from the run's settings (classification: `--model`), or None
        (the default): the task builds its own model, and `--model` is none of its settings. A named model
        defines the run: `run.json` records it as `model.name`, and a resume may not change it."""
        return None

    def model_description(self, model: keras.Model) -> str:
        """The model's name in the banner, `metrics.json` and the HParams record (`model`). Default: the Keras
        model's name."""
        return model.name

    def describe(self) -> dict:
        """What `run.json` records about the task beyond its name (e.g. a corpus's sha256)."""
        return {}


def nats_to_bits(nats: float) -> float:
    """Nats -> bits (for bits-per-byte figures)."""
    return nats / math.log(2.0)
