"""`--task=classify`'s declaration, without TensorFlow (`tasks.classify` imports Keras): no arguments of its
own (its model is `--model`), and the one rule it puts on the run: its records carry class labels, so own
records need `--num_classes`, and are not the language model's token records (a vocab.json beside them)."""

from __future__ import annotations

from data import text_vocab
from tasks.options import Options


def _classes_given(config, values: dict) -> str:
    d = config.data
    if d.train_data and d.num_classes < 2:
        return _records(config, values)[0] or f"--num_classes ({d.num_classes}) must be given (>= 2) with --train_data"
    return ""


def _records(config, values: dict) -> tuple[str, list[str]]:
    """The language model's token records (a vocab.json beside them) are not this task's."""
    del values
    found = text_vocab.vocab_beside(config.data.train_data) if config.data.train_data else None
    if found is None:
        return "", []
    return (
        f"--train_data holds the language model's token records ({found[0]}: {text_vocab.describe(found[1])}), "
        "not images or vectors with class labels; did you mean --task=lm?"
    ), []


OPTIONS = Options(
    help="classify: images or vectors with softmax cross-entropy and accuracy (--model).",
    rule=_classes_given,
    records=_records,
)
