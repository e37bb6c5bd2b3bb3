"""One row of the flag table (`trainer.settings.table`) and the checks and parsers rows share."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from trainer.settings.config import ConfigError

FIXED, FREE = "fixed", "free"  # a resume may not (may) change the setting (`--allow_flag_changes` aside)


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag. `check(value)` returns what is wrong with a (parsed) value, or "" (`trainer.settings.validate`
    prefixes the flag); `parse(text or list)` turns absl's value into the setting's, raising ConfigError.

    A row with `task` is a built-in task's own argument (`tasks.options.Argument`): its value lives in
    `config.task.options` (`field` is "task.<argument>") when --task names that task, its default is `default`,
    and the task checks it (`tasks.check_settings`)."""

    name: str
    field: str  # "group.field" of RunConfig, or a top-level field ("seed")
    group: str
    help: str
    resume: str = FIXED
    choices: tuple = ()
    check: Callable[[object], str] | None = None
    parse: Callable[[object], object] | None = None
    task: str = ""  # the built-in task whose argument this row is; "" for the engine's own settings
    default: object = None  # a task argument's default (an engine setting's is its dataclass default)


def at_least(bound: int, note: str = "") -> Callable[[object], str]:
    """`check` of a number that must be >= bound; "at least 1", or ">= 0 (note)"."""
    words = f"at least {bound}" if bound else ">= 0"
    words += f" ({note})" if note else ""
    return lambda value: "" if value >= bound else f"must be {words}"


def positive(value) -> str:
    """`check` of a finite number > 0 (inf and nan are numbers absl parses, and no step survives them)."""
    if math.isfinite(value) and value > 0:
        return ""
    return "must be positive" if math.isfinite(value) else "must be a finite positive number"


def in_range(low: float, high: float, note: str = "") -> Callable[[object], str]:
    """`check` of a finite number in [low, high]."""
    words = f"must be in [{low}, {high}]" if math.isfinite(high) else f"must be a finite number >= {low}"
    words += f" ({note})" if note else ""
    return lambda value: "" if math.isfinite(value) and low <= value <= high else words


def ints(count: int = 0, what: str = "comma-separated integers"):
    def parse(values):
        if not values:
            return None if count else ()
        try:
            numbers = tuple(int(v) for v in values)
        except ValueError:
            raise ConfigError(f"({','.join(values)}) must be {what}") from None
        if count and len(numbers) != count:
            raise ConfigError(f"({','.join(values)}) must be {what}")
        return numbers

    return parse


def floats(values):
    try:
        return tuple(float(v) for v in values or ())
    except ValueError:
        raise ConfigError(f"({','.join(values)}) must be comma-separated numbers") from None
