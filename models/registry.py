"""Name -> builder registry for the built-in models.

A builder is any callable ``builder(input_shape, num_classes) -> keras.Model`` that returns logits.
Built-ins register themselves with :func:`register` when their module is imported (``models/__init__.py``
imports them all); users plug in their own builders through the ``"package.module:function"`` form of
:func:`models.build_model` instead of registering.
"""

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
