"""The flag table (`trainer.settings.table`) as absl flags, and parsed flags as a `RunConfig`.

Only the entry points (`trainer/__main__.py`, `launch.slurm`'s pre-check) call this; everything else reads
the `RunConfig`. Imports no TensorFlow, so bad flags fail before it loads.
"""

from __future__ import annotations

import dataclasses

from absl import flags

from trainer.settings import config as cfg
from trainer.settings import table
from trainer.settings.flag import Flag

GROUP_FLAGS: dict[str, tuple[str, ...]] = {}  # `--help` heading -> names of its flags, filled by define_flags


def group_blurbs() -> dict[str, str]:
    """`--help` heading -> the one-line description printed with it."""
    return dict(table.GROUPS)


def define_flags() -> None:
    """Defines every flag of the table on absl's global FLAGS and records each group's flags in `GROUP_FLAGS`;
    a second call in the same process does nothing."""
    if GROUP_FLAGS:
        return
    for flag in table.FLAGS:
        _define(flag)
    for group in table.GROUPS:
        GROUP_FLAGS[group] = tuple(f.name for f in table.FLAGS if f.group == group)


def _define(flag: Flag) -> None:
    """One absl flag: its kind and default follow the setting's dataclass default (a tuple or None is a list)."""
    value = flag.default if flag.task else table.setting(cfg.RunConfig(), flag.field)
    text = table.help_text(flag)
    if flag.choices:
        flags.DEFINE_enum(flag.name, value, list(flag.choices), text)
    elif isinstance(value, bool):
        flags.DEFINE_bool(flag.name, value, text)
    elif isinstance(value, int):
        flags.DEFINE_integer(flag.name, value, text)
    elif isinstance(value, float):
        flags.DEFINE_float(flag.name, value, text)
    elif isinstance(value, cfg.Normalization):
        flags.DEFINE_string(flag.name, value.text, text)
    elif isinstance(value, str):
        flags.DEFINE_string(flag.name, value, text)
    else:  # a tuple, or None for "not given"
        flags.DEFINE_list(flag.name, list(value) if value else None if value is None else [], text)


def config_from_flags(values) -> cfg.RunConfig:
    """Parsed flags as a `RunConfig`, built by keyword from the table (not yet validated or resolved:
    `trainer.settings.resolve.resolve`).

    Raises:
      ConfigError: a list flag's values do not parse, or a built-in task's argument is set away from its
        default while --task names another task; the message names the flag.
    """
    groups: dict[str, dict] = {}
    top: dict = {}
    options = {}  # the named task's own arguments (a built-in's); other tasks' flags are not its settings
    task_name = values[table.BY_FIELD["task.name"].name].value
    for flag in table.FLAGS:
        value = _parsed(flag, values[flag.name].value)
        group, _, field = flag.field.rpartition(".")
        if flag.task:
            if flag.task == task_name:
                options[field] = value
            elif value != flag.default:  # a flagfile of any run lists every task's flags, at their defaults
                raise cfg.ConfigError(
                    f"--{flag.name} ({value}) is an argument of --task={flag.task}, and this run's task is "
                    f"{task_name!r}: drop the flag, or pass --task={flag.task}"
                )
            continue
        (groups.setdefault(group, {}) if group else top)[field] = value
    groups["task"]["options"] = tuple(sorted(options.items()))
    default = cfg.RunConfig()
    made = {name: dataclasses.replace(getattr(default, name), **fields) for name, fields in groups.items()}
    return dataclasses.replace(default, **made, **top)


def _parsed(flag: Flag, value):
    if flag.parse is None:
        return value
    try:
        return flag.parse(value)
    except cfg.ConfigError as e:  # the list parsers say what is wrong with "(values)"; name the flag
        message = str(e)
        raise cfg.ConfigError(message if message.startswith("--") else f"--{flag.name} {message}") from None


def flagfile_text(values) -> str:
    """An absl flagfile with every towerflow flag's value, so `--flagfile=` reproduces the run."""
    lines = [values[flag.name].serialize() for flag in sorted(table.FLAGS, key=lambda f: f.name)]
    return "\n".join(line for line in lines if line) + "\n"
