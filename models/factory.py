"""``build_model``: turns a model name into a checked logits model.

A name is either a registered built-in (``"cnn"``) or ``"package.module:function"``; the function is
imported and called as ``fn(input_shape, num_classes)``. Every result is checked the same way, so the
trainer can rely on: a built ``keras.Model`` whose output is ``(batch, num_classes)`` logits.
"""

import numbers

import keras

from models.registry import Builder, ModelError, get_builder, import_named


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """Builds the model ``name`` for inputs of ``input_shape`` (no batch dim) and ``num_classes`` logits.

    Args:
      name: a built-in name (see ``available_models()``) or ``"package.module:function"``.
      input_shape: shape of one example, e.g. ``(8, 8, 1)`` (channels last) or ``(64,)``.
      num_classes: number of classes, >= 2; the model outputs that many logits (no softmax).

    Returns:
      A built ``keras.Model`` with output shape ``(None, num_classes)``. Weights are random, drawn from
      Keras's global RNG (``keras.utils.set_random_seed`` makes them reproducible); nothing is downloaded.

    Raises:
      ModelError: unknown built-in, unimportable module, missing or non-callable function, a result that
        is not a built keras.Model with ``(None, num_classes)`` output, num_classes < 2, a malformed
        input_shape, or an input_shape the model cannot take.
    """
    if not isinstance(name, str) or not name:
        raise ModelError(f"model name must be a non-empty string; got {name!r}")
    input_shape = _checked_input_shape(input_shape)
    if not _is_int(num_classes) or num_classes < 2:
        raise ModelError(f"num_classes must be an integer >= 2; got {num_classes!r}")
    num_classes = int(num_classes)
    builder = _load_custom(name) if ":" in name else get_builder(name)
    model = builder(input_shape, num_classes)
    _check_model(model, name, input_shape, num_classes)
    return model


def _checked_input_shape(input_shape) -> tuple[int, ...]:
    """Returns ``input_shape`` as a tuple of positive ints, or raises ModelError."""
    try:
        dims = tuple(input_shape)
    except TypeError:
        raise ModelError(f"input_shape must be a tuple of positive ints; got {input_shape!r}") from None
    # A None (unknown) dim is rejected too: Flatten and Dense need static sizes, and so does the trainer.
    if not dims or not all(_is_int(d) and d > 0 for d in dims):
        raise ModelError(f"input_shape must be a non-empty tuple of positive ints; got {input_shape!r}")
    return tuple(int(d) for d in dims)


def _is_int(value) -> bool:
    # numpy integers (e.g. from array.shape arithmetic) are fine; bools and floats are not.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _load_custom(spec: str) -> Builder:
    """Imports ``"package.module:function"`` and returns the function."""
    try:
        _, builder = import_named(spec, "package.module:function")
    except LookupError as e:
        raise ModelError(f"custom model {spec!r}: {e}") from e.__cause__
    attr = spec.partition(":")[2]
    if not callable(builder):
        raise ModelError(
            f"custom model {spec!r}: {attr!r} is a {type(builder).__name__}, not a callable "
            "fn(input_shape, num_classes) -> keras.Model"
        )
    return builder


def _check_model(model, name: str, input_shape: tuple[int, ...], num_classes: int) -> None:
    """Raises ModelError unless ``model`` is a built keras.Model with (None, num_classes) output."""
    if not isinstance(model, keras.Model):
        raise ModelError(f"model {name!r}: the builder returned a {type(model).__name__}, not a keras.Model")
    if not model.built:
        # The trainer needs the variables before the first step (stateless_call, checkpoints).
        raise ModelError(
            f"model {name!r} is not built: start it from keras.Input(shape=input_shape) "
            "or call model.build((None, *input_shape)) in the builder"
        )
    try:
        output = model.compute_output_spec(keras.KerasTensor((None, *input_shape)))
    except Exception as e:  # any failure here means the model cannot take this input_shape
        raise ModelError(f"model {name!r} cannot take inputs of shape {input_shape}: {e}") from e
    if not isinstance(output, keras.KerasTensor):
        raise ModelError(f"model {name!r} must have one logits output; it has {type(output).__name__}")
    if len(output.shape) != 2 or output.shape[-1] != num_classes:
        raise ModelError(
            f"model {name!r} must output logits of shape (batch, num_classes={num_classes}); "
            f"its output shape is {tuple(output.shape)}"
        )
