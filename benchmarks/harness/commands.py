"""One entry point per group of measurements: `python -m benchmarks.machines NAME ...` runs NAME's `main`.

A group's `__main__.py` names its commands once (name -> module); without a name, or with `-h`, the group lists
them with the first sentence of each module's docstring, so what can be run is said in one place.
"""

from __future__ import annotations

import importlib
import sys


def summary(module_name: str) -> str:
    """The first sentence of the module's docstring, after its "`python -m ...`: " prefix."""
    doc = importlib.import_module(module_name).__doc__ or ""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    return paragraph.split("`: ", 1)[-1].split(". ")[0].rstrip(".")


def usage(prog: str, commands: dict[str, str]) -> str:
    """The group's commands, one line each."""
    lines = [f"usage: {prog} NAME [ARGS]   (NAME --help: its options)", "", "commands:"]
    lines += [f"  {name:16s} {summary(module)}" for name, module in commands.items()]
    return "\n".join(lines)


def dispatch(prog: str, commands: dict[str, str], argv: list[str]) -> int:
    """Runs `commands[argv[0]]`'s `main(argv[1:])`; returns the exit code (2 for an unknown name)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(prog, commands))
        return 0
    name, *rest = argv
    if name not in commands:
        print(f"{prog}: unknown command {name!r}; choose from {', '.join(commands)}", file=sys.stderr)
        return 2
    code = importlib.import_module(commands[name]).main(rest)
    return code or 0
