"""Does the task's model look at padding? One eval example, padded to two of its feature's bucket lengths,
run through the model twice before the first step; outputs that differ get one warning line.

Padding reaches the model (only the loss is masked, by the task's weights): a model that mean-pools or
attends over the padded positions gives an example outputs that depend on how far its batch was padded, so
serving disagrees with eval. The check costs two forward calls in inference mode on one example, reads
nothing random and changes no variable (the trained bits are the same with it). It is skipped for tasks
whose variable-length features have one bucket, or none.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

import data
from data.feature_batches import LENGTH_SUFFIX

_EXAMPLES = 8  # eval examples tried, to find one whose bucket is not the last
_TOLERANCE = 1e-4  # of the output's largest magnitude (plus 1): what float rounding may move


def check_padding(task, model, reader, inputs) -> None:
    """Warns (one line on stderr) when the model's output for an eval example changes with its padding.

    Args:
        task: The run's task (`preprocess`, `model_inputs`).
        model: Its Keras model, built.
        reader: The run's reader of records (`trainer.loop.records`): only a task's own records are checked.
        inputs: The resolved inputs (their eval records are read).
    """
    schema = getattr(reader, "schema", None)
    if schema is None or not any(len(f.buckets) > 1 for _, f in schema.features):
        return
    examples = data.feature_eval_dataset(inputs.eval, data.Stream(batch_size=1), task.preprocess)
    variable = [f for _, f in schema.features if f.variable]
    # A padded output comes with its `_length`; it is padded as its feature, or as the only variable one.
    padded = {
        key: schema.as_dict().get(key, variable[0])
        for key in examples.element_spec
        if key + LENGTH_SUFFIX in examples.element_spec
    }
    for batch in examples.take(_EXAMPLES):
        further = _padded_further(batch, padded)
        if further is None:
            continue  # already at its features' last bucket
        key, short, long, longer = further
        length = int(batch[key + LENGTH_SUFFIX][0])
        difference = _difference(task, model, (batch, longer), long - short, length - short)
        if difference is not None:
            print(
                f"warning: task '{task.name}': the model's output for one example changes with its padding (max "
                f"difference {difference:.3g} between lengths {short} and {long}); mask the padded positions: "
                "docs/tasks.md#padding",
                file=sys.stderr,
                flush=True,
            )
        return


def _padded_further(batch: dict, padded: dict) -> tuple[str, int, int, dict] | None:
    """(a key, its padded length, its feature's last bucket, the batch with every padded output padded to its
    feature's last bucket), or None when each is there already."""
    moved = [(key, int(batch[key].shape[1]), f.buckets[-1]) for key, f in padded.items()]
    moved = [m for m in moved if m[1] < m[2]]
    if not moved:
        return None
    longer = dict(batch)
    for key, feature in padded.items():
        values = batch[key]
        pad = b"" if values.dtype == tf.string else tf.cast(feature.pad, values.dtype)
        longer[key] = tf.pad(values, [[0, 0], [0, feature.buckets[-1] - values.shape[1]]], constant_values=pad)
    return (*moved[0], longer)


def _difference(task, model, batches: tuple[dict, dict], grown: int, offset: int) -> float | None:
    """The largest difference between the model's outputs on the two paddings of the example (`batches`, the
    second padded `grown` positions more) at its true positions, or None when within rounding. An output whose
    axis 1 grew by `grown` is a sequence: only its positions before the true length are compared (`offset`:
    the true length minus the shorter padded length, added to the output's axis, which may be shifted, as
    for tokens[:, :-1]); an output of the same shape is compared whole; any other is skipped."""
    outputs = [_numpy(model(task.model_inputs(b), training=False)) for b in batches]
    worst, scale = 0.0, 0.0
    for a, b in zip(*outputs, strict=True):
        if a.shape != b.shape:
            same_rest = a.ndim == b.ndim >= 2 and a.shape[0] == b.shape[0] and a.shape[2:] == b.shape[2:]
            if not same_rest or b.shape[1] - a.shape[1] != grown:
                continue
            true = max(0, a.shape[1] + offset)
            a, b = a[:, :true], b[:, :true]
        if a.size:
            worst, scale = max(worst, float(np.max(np.abs(a - b)))), max(scale, float(np.max(np.abs(a))))
    return worst if worst > _TOLERANCE * (1.0 + scale) else None


def _numpy(outputs) -> list[np.ndarray]:
    return [np.asarray(tf.cast(v, tf.float32)) for v in tf.nest.flatten(outputs)]
