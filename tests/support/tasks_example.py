"""A user's own task, written only against the documented interface (docs/tasks.md): regression of a float
`y` on 8 dense float features `x`, squared error per example, its own metric `mae`, an option from
`--task_args=hidden=N` and a serving signature. Run it as `--task=tests.support.tasks_example:Regression` from the
repository's root (`python -m` puts the working directory on sys.path; `tests/` and `tests/support/` are packages).

`write_records` makes its records: y = x . W_TRUE + B_TRUE + noise, a fixed function, so the tests know the
best mean absolute error a model can reach (the noise's: NOISE * sqrt(2 / pi)).
"""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf

import data
from tasks import Feature, Task, TaskError

WIDTH = 8
W_TRUE = np.linspace(-1.0, 1.0, WIDTH).astype(np.float32)
B_TRUE = 0.5
NOISE = 0.1  # the standard deviation of y's noise


class Regression(Task):
    """y ~ MLP(x): one hidden ReLU layer of `hidden` units (`--task_args=hidden=16`, the default)."""

    name = "regression"
    metric_names = ("mae",)
    eval_metric = "mae"

    def __init__(self, config):
        super().__init__(config)
        hidden = config.task.arg_dict.get("hidden", "16")
        if not hidden.isdigit() or int(hidden) < 1:
            raise TaskError(f"task regression: --task_args=hidden={hidden} must be a positive integer")
        self.hidden = int(hidden)

    def features(self):
        return {"x": Feature("float32", shape=(WIDTH,)), "y": Feature("float32")}

    def build_model(self):
        inputs = keras.Input((WIDTH,), name="x")
        hidden = keras.layers.Dense(self.hidden, activation="relu")(inputs)
        return keras.Model(inputs, keras.layers.Dense(1)(hidden)[:, 0], name=f"regression_mlp{self.hidden}")

    def model_inputs(self, batch):
        return batch["x"]

    def loss(self, outputs, batch):
        errors = outputs - batch["y"]
        return tf.square(errors), tf.ones_like(errors)  # summed by the engine, divided once by the global weight

    def metrics(self, outputs, batch):
        errors = tf.abs(outputs - batch["y"])
        return {"mae": (tf.reduce_sum(errors), tf.cast(tf.size(errors), tf.float32))}

    def serving(self, model):
        def predict(x):
            return {"y": model(x, training=False)}

        return {"serving_default": (predict, [tf.TensorSpec([None, WIDTH], tf.float32, name="x")])}

    def describe(self):
        return {"hidden": self.hidden}


def examples(n: int, seed: int) -> list[dict]:
    """`n` records of the fixed linear function plus noise, drawn from `seed`."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, WIDTH)).astype(np.float32)
    y = x @ W_TRUE + B_TRUE + rng.normal(scale=NOISE, size=n).astype(np.float32)
    return [{"x": x[i], "y": [y[i]]} for i in range(n)]


def write_records(directory: str, train_files: int = 3, per_file: int = 128, eval_records: int = 200) -> tuple:
    """Writes train-0000i-of-0000N.tfrecord and eval.tfrecord under `directory`; returns the (train, eval) globs."""
    schema = data.FeatureSchema.of(Regression.features(None), Regression.name)
    for i in range(train_files):
        path = os.path.join(directory, f"train-{i:05d}-of-{train_files:05d}.tfrecord")
        data.write_feature_records(path, examples(per_file, seed=i), schema)
    data.write_feature_records(os.path.join(directory, "eval.tfrecord"), examples(eval_records, seed=99), schema)
    return os.path.join(directory, "train-*.tfrecord"), os.path.join(directory, "eval.tfrecord")


class Padded(Regression):
    """The same regression over a variable-length `x` of up to WIDTH values, padded with 0 to WIDTH (its one
    bucket): for the records-longer-than-max_length check."""

    name = "padded"

    def features(self):
        return {"x": Feature("float32", max_length=WIDTH), "y": Feature("float32")}


class Unserved(Regression):
    """Serves nothing: a run that exports is refused at its start."""

    def serving(self, model):
        return {}


class Misnamed(Regression):
    """Declares a metric its `metrics` does not return."""

    metric_names = ("rmse",)


VOCAB = 32  # the token tasks' embedding rows: ids in [0, VOCAB)


class Tokens(Task):
    """y ~ Dense(mean of the embeddings of `tokens`' real positions): a variable-length int64 feature padded to
    8 or 16, its padding masked out of the mean (`tokens_length`); no bounds declared."""

    name = "tokens"
    masked = True

    def features(self):
        return {"tokens": Feature("int64", max_length=16, buckets=(8, 16)), "y": Feature("float32")}

    def build_model(self):
        model = _Pool(self.masked)
        model((tf.zeros([1, 8], tf.int64), tf.ones([1], tf.int32)))
        return model

    def model_inputs(self, batch):
        return batch["tokens"], batch["tokens_length"]

    def loss(self, outputs, batch):
        errors = outputs - batch["y"]
        return tf.square(errors), tf.ones_like(errors)


class MeanOverPadding(Tokens):
    """The same model, its mean taken over every position, padding included: outputs depend on the padding."""

    masked = False


class BoundedTokens(Tokens):
    """Tokens declaring their range, the embedding's rows: a record outside it is named by the pipeline."""

    def features(self):
        return {**super().features(), "tokens": Feature("int64", max_length=16, buckets=(8, 16), bounds=(0, VOCAB))}


class OptionalTags(Tokens):
    """Reads an optional `tags` list too, which records may lack (then empty); the model ignores it."""

    def features(self):
        return {**super().features(), "tags": Feature("int64", max_length=4, optional=True)}


class _Pool(keras.Model):
    def __init__(self, masked: bool):
        super().__init__(name="masked_pool" if masked else "mean_over_padding")
        self.masked = masked
        self.embed = keras.layers.Embedding(VOCAB, 4)
        self.out = keras.layers.Dense(1)

    def call(self, inputs, training=False):
        del training
        tokens, lengths = inputs
        vectors = self.embed(tokens)
        if not self.masked:
            return self.out(tf.reduce_mean(vectors, axis=1))[:, 0]
        mask = tf.sequence_mask(lengths, tf.shape(tokens)[1], dtype=vectors.dtype)[:, :, None]
        count = tf.maximum(tf.cast(lengths, vectors.dtype), 1.0)[:, None]
        return self.out(tf.reduce_sum(vectors * mask, axis=1) / count)[:, 0]


def token_examples(n: int, seed: int) -> list[dict]:
    """`n` records of 2..7 token ids in [1, VOCAB), y their mean over VOCAB."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 8, size=n)
    tokens = [rng.integers(1, VOCAB, size=length) for length in lengths]
    return [{"tokens": t, "y": [t.mean() / VOCAB]} for t in tokens]


class Branching(Regression):
    """Branches in Python on a tensor's value in its loss: refused in one line when the step traces."""

    def loss(self, outputs, batch):
        errors = outputs - batch["y"]
        if tf.reduce_sum(errors) > 0:  # a tensor as a Python bool: tf.cond or tf.where in graph code
            errors = -errors
        return tf.square(errors), tf.ones_like(errors)
