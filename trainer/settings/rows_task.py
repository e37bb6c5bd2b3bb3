"""Rows of the flag table (`trainer.settings.table`) for the workload: the task, its options, and the built-in
language model's sizes (`tasks`)."""

from __future__ import annotations

from trainer.settings import config as cfg
from trainer.settings.flag import Flag, at_least, in_range


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
        Flag(
            "task",
            "task.name",
            g,
            "The workload. classify: images or vectors with softmax cross-entropy and accuracy (--model). lm: a "
            "decoder-only Transformer language model over text records (python -m data.prepare text; without "
            "--train_data the built-in corpus). Or 'package.module:Class', a subclass of tasks.Task (docs/tasks.md).",
        ),
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
        Flag("lm_layers", "task.layers", g, "--task=lm: Transformer blocks.", check=at_least(1)),
        Flag("lm_heads", "task.heads", g, "--task=lm: attention heads; they divide --lm_width.", check=at_least(1)),
        Flag("lm_width", "task.width", g, "--task=lm: the model width (embedding size).", check=at_least(1)),
        Flag(
            "lm_context",
            "task.context",
            g,
            "--task=lm: tokens a prediction sees; records hold up to this + 1 tokens.",
            check=at_least(1),
        ),
        Flag("lm_positions", "task.positions", g, "--task=lm: position encoding.", choices=cfg.POSITIONS),
        Flag("lm_dropout", "task.dropout", g, "--task=lm: dropout rate, in [0, 1).", check=in_range(0, 0.99)),
    ]
