"""Rows of the flag table (`trainer.settings.table`) for the workload: the task, a user task's options, and the
built-in tasks' own arguments, one row each, learned from their declarations (`tasks.built_in_arguments`)."""

from __future__ import annotations

import tasks
from trainer.settings import config as cfg
from trainer.settings.flag import Flag, at_least


def task_args(values) -> tuple[tuple[str, str], ...]:
    """--task_args "a=1,b=x" -> (("a", "1"), ("b", "x")): each entry KEY=VALUE, each key once."""
    pairs = []
    for entry in values or ():
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise cfg.ConfigError(f"({','.join(values)}) must be KEY=VALUE entries; {entry!r} is not")
        pairs.append((key, value))
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise cfg.ConfigError(f"({','.join(values)}) names a key twice")
    return tuple(pairs)


def task() -> list[Flag]:
    g = "task"
    return [
        Flag("task", "task.name", g, tasks.task_help()),
        Flag(
            "group_by_length",
            "data.group_by_length",
            g,
            "A task's variable-length records: sort each pool of this many micro-batches by length before "
            "cutting it into micro-batches (less padding; the pool's batches in a seeded order). Each stream "
            "groups its own records, so nothing depends on the towers. 0: batches in record order.",
            check=at_least(0),
        ),
        Flag("task_args", "task.args", g, "A user task's own options: KEY=VALUE,... (strings).", parse=task_args),
        *(_argument(name, argument) for name, argument in tasks.built_in_arguments()),
    ]


def _argument(task_name: str, argument: tasks.Argument) -> Flag:
    """A built-in task's argument as a row: the task checks its value (`tasks.check_settings`)."""
    return Flag(
        argument.flag,
        f"task.{argument.name}",
        "task",
        argument.help,
        choices=argument.choices,
        check=argument.problem,
        task=task_name,
        default=argument.default,
    )
