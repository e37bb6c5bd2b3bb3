"""Workloads: the `Task` interface (`tasks.base`) and the built-in tasks.

`make_task(config)` turns `--task` into a task object: a built-in name (`BUILT_IN`) or
"package.module:Class", a subclass of `Task` constructed with the run's settings.
"""

from __future__ import annotations

from data.schema import Feature
from models.registry import import_named
from tasks.base import Task

# Built-in task name -> "module:Class"; imported on first use (the language model pulls in more of Keras).
BUILT_IN = {"classify": "tasks.classify:Classify", "lm": "tasks.lm:LanguageModel"}

__all__ = ["BUILT_IN", "Feature", "Task", "TaskError", "make_task"]


class TaskError(ValueError):
    """A task that cannot be found, imported or made; the message names it and says what to change."""


def make_task(config) -> Task:
    """The run's task, from `config.task.name` (see module doc), constructed with `config`.

    Raises:
      TaskError: an unknown built-in, a module that does not import, a missing attribute, or an attribute
        that is not a `Task` subclass.
    """
    spec = config.task.name
    path = BUILT_IN.get(spec, spec)
    if ":" not in path:
        raise TaskError(
            f"--task={spec!r}: unknown task; built-in tasks are {', '.join(sorted(BUILT_IN))}, or name your own "
            "as 'package.module:Class'"
        )
    cls = _load(spec, path)
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TaskError(f"--task={spec!r}: {path.partition(':')[2]!r} is not a subclass of tasks.Task")
    return cls(config)


def _load(spec: str, path: str):
    try:
        return import_named(path, "package.module:Class")[1]
    except LookupError as e:
        raise TaskError(f"--task={spec!r}: {e}") from e.__cause__
