"""A model's index lookup that failed on a value of the data: one line naming the suspects, not a traceback.

An embedding (or any `tf.gather`) given an index outside its table fails the step with TensorFlow's
`indices[30,17] = 8364 is not in [0, 256)`, naming no feature, file or record. A feature that declares its
`bounds` is checked in the input pipeline instead (`data.feature_pipeline`), which names the record; for the
others, `explain_lookup` turns that error into a DataError naming the task's int64 features without bounds
and saying how to have the record named. Any other error is left as it is.
"""

from __future__ import annotations

import re

import tensorflow as tf

from data.schema import DataError, FeatureSchema

_LOOKUP = re.compile(r"indices\[[\d,]*\] = (-?\d+) is not in \[0, (\d+)\)")


def explain_lookup(error: BaseException, schema: FeatureSchema, what: str) -> DataError | None:
    """A DataError for a step (or eval) that failed on an index outside a lookup table, or None.

    Args:
        error: What the step raised: a `tf.errors.InvalidArgumentError`, or an exception whose `__cause__`
            chain holds one (async towers wrap theirs).
        schema: The task's features: its int64 ones without bounds are the suspects.
        what: The data that was read ("--train_data", "--eval_data").
    """
    while error is not None and not isinstance(error, tf.errors.OpError):
        error = error.__cause__
    found = _LOOKUP.search(error.message) if isinstance(error, tf.errors.InvalidArgumentError) else None
    if found is None:
        return None
    value, size = found.groups()
    suspects = [key for key, f in schema.features if f.dtype == "int64" and f.bounds is None]
    failed = f"task '{schema.task}': the model looked up {value}, outside its table [0, {size}), in a batch of {what}"
    if not suspects:
        return DataError(f"{failed}; every int64 feature declares bounds, so preprocess or the model made that index")
    named = ", ".join(f"'{key}'" for key in suspects)
    return DataError(
        f"{failed}; a record's {named} may hold it: declare the feature's range, "
        f"Feature(..., bounds=(0, {size})), to have the record named before the model sees it"
    )
