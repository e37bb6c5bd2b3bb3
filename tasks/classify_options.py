"""`--task=classify`'s declaration, without TensorFlow (`tasks.classify` imports Keras): no arguments of its
own (its model is `--model`), and the one rule it puts on the run: its records carry class labels, so own
records need `--num_classes`."""

from __future__ import annotations

from tasks.options import Options


def _classes_given(config, values: dict) -> str:
    del values
    d = config.data
    if d.train_data and d.num_classes < 2:
        return f"--num_classes ({d.num_classes}) must be given (>= 2) with --train_data"
    return ""


OPTIONS = Options(
    help="classify: images or vectors with softmax cross-entropy and accuracy (--model).", rule=_classes_given
)
