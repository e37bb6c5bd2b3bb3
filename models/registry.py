"""Name -> builder registry for the built-in models.

A builder is any callable ``builder(input_shape, num_classes) -> keras.Model`` that returns logits.
Built-ins register themselves with :func:`register` when their module is imported (``models/__init__.py``
imports them all); users plug in their own builders through the ``"package.module:function"`` form of
:func:`models.build_model` instead of registering.
"""

import importlib
from collections.abc import Callable

Builder = Callable[[tuple[int, ...], int], object]

_BUILDERS: dict[str, Builder] = {}


class ModelError(ValueError):
    """A model name, shape or builder that cannot give a valid logits model; the message says why."""


def register(name: str) -> Callable[[Builder], Builder]:
    """Returns a decorator that registers a builder under ``name``.

    Raises:
      ModelError: if ``name`` is taken or contains ":", which marks the "module:function" form.
    """
    if ":" in name:
        raise ModelError(f"built-in model name {name!r} must not contain ':' (reserved for module:function)")

    def decorator(builder: Builder) -> Builder:
        if name in _BUILDERS:
            raise ModelError(f"model {name!r} is already registered (by {_BUILDERS[name].__module__})")
        _BUILDERS[name] = builder
        return builder

    return decorator


def available_models() -> list[str]:
    """Returns the names of the registered built-in models, sorted."""
    return sorted(_BUILDERS)


def get_builder(name: str) -> Builder:
    """Returns the builder registered under ``name``.

    Raises:
      ModelError: if no built-in has that name; the message lists the available ones.
    """
    try:
        return _BUILDERS[name]
    except KeyError:
        raise ModelError(
            f"unknown model {name!r}; built-in models are: {', '.join(available_models())}; "
            "a custom builder is named as 'package.module:function'"
        ) from None


def import_named(spec: str, form: str):
    """Imports "package.module:attribute" and returns (the module, the attribute); a user's own model and a
    user's own task (`tasks.make_task`) are named this way.

    Raises:
      LookupError: the spec is not of that form (`form` names the expected one in the message), the module does
        not import, or it has no such attribute; the message says which, without the caller's prefix.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr or ":" in attr:
        raise LookupError(f"must have the form {form!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise LookupError(f"cannot import module {module_name!r}: {e}") from e
    try:
        return module, getattr(module, attr)
    except AttributeError:
        where = getattr(module, "__file__", None)
        raise LookupError(f"module {module_name!r} (from {where}) has no attribute {attr!r}") from None
