"""Workloads: the `Task` interface (`tasks.base`) and the built-in tasks.

`make_task(config)` turns `--task` into a task object: a built-in name (`BUILT_IN`) or
"package.module:Class", a subclass of `Task` constructed with the run's settings. `check_name` checks the
name without importing the task, so that `python -m trainer` refuses a bad one before TensorFlow is imported:
`Task` (`tasks.base`, which imports TensorFlow) loads on first use (PEP 562).

A built-in task is a user task that ships with towerflow. What the engine needs before TensorFlow, each
declares in a module of its own without it (`tasks.options.Options`: its `--task` help, its typed arguments
and their flags, its rules on the run's settings and on its records): `built_in_arguments`, `check_settings`,
`check_records` and `task_help` are what the engine reads of them, so it never names a task.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from data.schema import Feature
from tasks import classify_options, lm_options
from tasks.options import Argument, Options

if TYPE_CHECKING:
    from tasks.base import Task

# Built-in task name -> "module:Class"; imported on first use (the language model pulls in more of Keras).
BUILT_IN = {"classify": "tasks.classify:Classify", "lm": "tasks.lm:LanguageModel"}
# Built-in task name -> its declaration (TF-free); a task without one declares nothing.
DECLARED = {"classify": classify_options.OPTIONS, "lm": lm_options.OPTIONS}
DEFAULT = "classify"  # --task's default

__all__ = ["BUILT_IN", "DEFAULT", "Argument", "Feature", "Options", "Task", "TaskError", "make_task"]


class TaskError(ValueError):
    """A task that cannot be found, imported or made; the message names it and says what to change."""


def __getattr__(name: str):
    if name == "Task":
        from tasks.base import Task  # noqa: PLC0415 (TensorFlow: on first use)

        globals()["Task"] = Task
        return Task
    raise AttributeError(f"module 'tasks' has no attribute '{name}'")


def options(spec: str) -> Options:
    """The declaration of the task `--task=spec` names: a built-in's, else one of nothing (a user task reads
    `--task_args`)."""
    return DECLARED.get(spec, Options())


def built_in_arguments() -> list[tuple[str, Argument]]:
    """(task, argument) of every built-in task's arguments, in `BUILT_IN` order: the engine's flags for them."""
    return [(name, argument) for name, declared in DECLARED.items() for argument in declared.arguments]


def check_settings(config) -> str:
    """The first problem the task `config.task.name` finds with its arguments (`config.task.options`) or the
    run's settings, as one line naming the flag; "" if none. Imports no TensorFlow."""
    return options(config.task.name).check(config, dict(config.task.options))


def check_records(config) -> tuple[str, list[str]]:
    """(the first problem the task `config.task.name` finds with the records the run names, as one line; the
    warning lines about them). Imports no TensorFlow; the globs are known to match."""
    return options(config.task.name).check_records(config, dict(config.task.options))


def task_help() -> str:
    """`--task`'s help: each built-in task's line, then how to name one's own."""
    lines = " ".join(declared.help for declared in DECLARED.values())
    return f"The workload. {lines} Or 'package.module:Class', a subclass of tasks.Task (docs/tasks.md)."


def check_name(spec: str) -> None:
    """Checks a `--task` value without importing the task: a built-in name, or "package.module:Class" whose
    module can be found (finding a submodule imports its parent packages, nothing else).

    Raises:
      TaskError: naming the value and what is wrong, as `make_task` would.
    """
    module = _path(spec).partition(":")[0]
    try:
        problem = "" if importlib.util.find_spec(module) else f"No module named {module!r}"
    except ImportError as e:  # a parent package that is missing, or not a package
        problem = str(e)
    if problem:
        raise TaskError(f"--task={spec!r}: cannot import module {module!r}: {problem}")


def make_task(config) -> Task:
    """The run's task, from `config.task.name` (see module doc), constructed with `config`.

    Raises:
      TaskError: an unknown built-in, a module that does not import, a missing attribute, or an attribute
        that is not a `Task` subclass.
    """
    from tasks.base import Task  # noqa: PLC0415

    spec = config.task.name
    path = _path(spec)
    cls = _load(spec, path)
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TaskError(f"--task={spec!r}: {path.partition(':')[2]!r} is not a subclass of tasks.Task")
    return cls(config)


def _path(spec: str) -> str:
    path = BUILT_IN.get(spec, spec)
    if ":" not in path:
        raise TaskError(
            f"--task={spec!r}: unknown task; built-in tasks are {', '.join(sorted(BUILT_IN))}, or name your own "
            "as 'package.module:Class'"
        )
    return path


def _load(spec: str, path: str):
    from models.registry import import_named  # noqa: PLC0415 (the models package imports Keras)

    try:
        return import_named(path, "package.module:Class")[1]
    except LookupError as e:
        raise TaskError(f"--task={spec!r}: {e}") from e.__cause__
