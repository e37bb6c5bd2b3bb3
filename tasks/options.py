"""What a built-in task declares without TensorFlow: its own typed arguments (each with its flag), its line of
`--task` help, and the rules it puts on the run's settings.

The engine learns the built-in tasks' flags from these declarations (`tasks.built_in_arguments`), checks
them before TensorFlow is imported (`tasks.check_settings`) and records the named task's arguments in
`run.json` as `task.<name>`; it never names a task. A task reads its values back with `Options.values`.
Imports nothing but the standard library.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Argument:
    """One argument of a task: `config.task.options[name]`, set by `--flag`, of `default`'s type.

    `low`/`high` bound a number (inclusive); `choices` list a text's values.
    """

    name: str
    flag: str
    default: int | float | str
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()

    def problem(self, value) -> str:
        """What is wrong with `value` ("must be at least 1", ...), or ""; the caller names the flag."""
        if self.choices:
            return "" if value in self.choices else f"must be one of {self.choices}"
        if self.high is not None:
            ok = math.isfinite(value) and self.low <= value <= self.high
            return "" if ok else f"must be in [{self.low}, {self.high}]"
        if self.low is not None and value < self.low:
            return f"must be at least {self.low:g}" if self.low else "must be >= 0"
        return ""


@dataclasses.dataclass(frozen=True)
class Options:
    """A task's declaration: `help` (its entry in `--task`'s help), its `arguments`, `rule(config, values) ->
    problem or ""`, what it asks of the run's settings beyond each argument's own check, and `fill(values) ->
    values`, what some arguments decide of others (a preset's sizes), applied whenever the values are read; and
    `records(config, values) -> (problem or "", warning lines)`, what it finds wrong with the records the run
    names, read from the files beside them (once their globs are known to match, still before TensorFlow)."""

    help: str = ""
    arguments: tuple[Argument, ...] = ()
    rule: Callable[[object, dict], str] | None = None
    fill: Callable[[dict], dict] | None = None
    records: Callable[[object, dict], tuple[str, list[str]]] | None = None

    def values(self, given: dict) -> dict:
        """Every argument's value: `given`'s, else its default, as the default's type; then `fill`'s.

        Raises:
          ValueError: a key that is no argument of the task.
        """
        names = {a.name: a for a in self.arguments}
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not among the task's arguments ({', '.join(names) or 'none'})")
        values = {a.name: type(a.default)(given.get(a.name, a.default)) for a in self.arguments}
        return self.fill(values) if self.fill else values

    def check(self, config, given: dict) -> str:
        """The first problem of the task's arguments (`--flag (value) problem`) or of its rule; "" if none."""
        try:
            values = self.values(given)
        except (ValueError, TypeError) as e:
            return f"--task={config.task.name}: {e}"
        for argument in self.arguments:
            value = values[argument.name]
            problem = argument.problem(value)
            if problem:
                shown = repr(value) if isinstance(value, str) else str(value)
                return f"--{argument.flag} ({shown}) {problem}"
        return self.rule(config, values) if self.rule else ""

    def check_records(self, config, given: dict) -> tuple[str, list[str]]:
        """(the first problem with the run's records, or ""; the warning lines about them)."""
        return self.records(config, self.values(given)) if self.records else ("", [])
