"""towerflow models: a registry of built-in Keras 3 models and ``build_model`` to get one by name.

    model = build_model("cnn", input_shape=(8, 8, 1), num_classes=10)   # logits, no softmax
    model = build_model("models.examples:example_linear", (784,), 10)   # any importable builder

This package imports nothing from ``trainer``, ``data`` or ``launch``.
"""

# Importing the built-in modules registers them; the order does not matter.
from models import cnn, mlp, resnet20, resnet50  # noqa: F401
from models.factory import build_model
from models.registry import ModelError, available_models

__all__ = ["ModelError", "available_models", "build_model"]
