"""towerflow models: a registry of built-in Keras 3 models and ``build_model`` to get one by name.

    model = build_model("cnn", input_shape=(8, 8, 1), num_classes=10)   # logits, no softmax
    model = build_model("models.examples:example_linear", (784,), 10)   # any importable builder

A sequence model does not fit the registry's (input_shape, num_classes) -> logits [B, C] contract: the
language model of `--task=lm` is the plain builder ``transformer_lm(vocab_size, ...)`` (models/transformer.py),
ids [B, T] -> logits [B, T, vocab].

This package imports nothing from ``trainer``, ``data`` or ``launch``.
"""

# Importing the built-in modules registers them; the order does not matter.
from models import cnn, mlp, resnet20, resnet50  # noqa: F401
from models.factory import build_model
from models.registry import ModelError, available_models
from models.transformer import transformer_lm

__all__ = ["ModelError", "available_models", "build_model", "transformer_lm"]
