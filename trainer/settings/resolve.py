"""`resolve(config) -> RunConfig`: the one step between what was asked (flags, or a library caller's
`RunConfig`) and what every part of the trainer reads.

It validates every setting (`trainer.settings.validate`) and fills in what the settings alone decide, so no
consumer decides it again: `--augment=auto` becomes the model family's augmentation (`augment_auto` says it
was auto), the task count comes from the cluster, and the task's declared arguments are all present (each
default filled in: `run.json` records them). A run calls it once, through `trainer.step.modes.settle`,
whose `Plan` (these settings and the update mode object) is passed down. What the records decide (the cache,
normalization per channel) is decided once they are found: `trainer.settings.preprocess.data_settings`.
Resolving a resolved config returns it unchanged. Imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses

import tasks
from trainer.settings.config import RunConfig
from trainer.settings.preprocess import resolve_augment
from trainer.settings.validate import validate


def resolve(config: RunConfig, num_tasks: int | None = None) -> RunConfig:
    """`config` validated, with `--augment=auto` resolved and, when given, `num_tasks` tasks.

    Raises:
      ConfigError: a setting is out of range or inconsistent with another; the message names the flag.
    """
    if num_tasks is not None:
        config = dataclasses.replace(config, towers=dataclasses.replace(config.towers, num_tasks=num_tasks))
    validate(config)
    options = tasks.options(config.task.name).values(config.task.option_dict)
    config = dataclasses.replace(config, task=dataclasses.replace(config.task, options=options))
    d = config.data
    if d.augment == "auto":
        augment = resolve_augment(d.augment, config.model.name, dense=d.record_schema == "dense")
        config = dataclasses.replace(config, data=dataclasses.replace(d, augment=augment, augment_auto=True))
    return config
