"""README.md's and docs/*.md's commands and quoted messages, read out of the pages, and each command checked
by its own module without running it (tests/user/test_docs.py holds the tables and the tests).

A trainer command is validated as `python -m launch.slurm` validates the flags it submits
(`launch.submit.slurm._trainer_flags`: absl's parse and the flag table's checks, no TensorFlow); `launch.slurm`
runs for real with `--dry_run`; any other module's `main` parses its arguments with its own parser and stops
there. A partial command (prose naming a command with some options, or a block's command that elides `...`) is
checked for its options' names: each must be one its module takes.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib
import importlib.util
import io
import os
import re
import shlex
from unittest import mock

from tests.support.paths import ROOT

PAGES = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
PYTHON_M = re.compile(r"\bpython (?:-u )?-m [\w.]+")
# A synopsis's placeholders, as whole words, and a value of the option's type for each.
PLACEHOLDERS = {
    "N": "1000",
    "S": "1",
    "T": "0.8",
    "K": "40",
    "TEXT": "The",
    "A": "acct",
    "$USER": "me",
    "$step": "4242",
}


def page_text(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def spaced(text: str) -> str:
    return " ".join(text.split())


def doc_commands() -> list[tuple[str, str, bool]]:
    """(page, command, whole) for every `python -m ...` of a bash block (continuations joined, comments
    dropped, up to a shell operator) and of an inline code span. `whole`: a block's command that elides
    nothing (no `...`); prose names a command with some of its options."""
    found = []
    for page in PAGES:
        text = page_text(page)
        for block in FENCE.finditer(text):
            if block.group(1) == "bash":
                for line in block.group(2).replace("\\\n", " ").splitlines():
                    found += [(page, c, " ..." not in c) for c in _commands_in(line.split(" #")[0])]
        for span in re.findall(r"`([^`]*)`", FENCE.sub("", text)):
            found += [(page, c, False) for c in _commands_in(spaced(span))]
    return found


def _commands_in(line: str) -> list[str]:
    commands = []
    for start in PYTHON_M.finditer(line):
        rest = re.split(r" (?:\|\||&&|;|\|) ", line[start.start() :])[0]
        commands.append(rest.strip())
    return commands


def doc_quotes() -> list[tuple[str, str]]:
    """(page, message) for every `error: ...`/`warning: ...` a page quotes (inline, or a block's line and its
    continuation), and every line of a refusal table (a table whose header names a `line` column)."""
    found = []
    for page in PAGES:
        text = page_text(page)
        for block in FENCE.finditer(text):
            for quote in re.findall(r"^((?:error|warning): .*?)(?=\n\n|\Z)", block.group(2), re.S | re.M):
                found.append((page, spaced(quote)))
        prose = FENCE.sub("", text)
        found += [(page, spaced(q)) for q in re.findall(r"`((?:\d: )?(?:error|warning): [^`]*)`", prose)]
        found += [(page, line) for line in _refusal_table_lines(prose)]
    return found


def _refusal_table_lines(text: str) -> list[str]:
    lines, column = [], None
    for row in text.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split(" | ")] if row.startswith("|") else None
        if cells is None:
            column = None
        elif column is None and "line" in cells:
            column = cells.index("line")
        elif column is not None and not set(cells[0]) <= {"-", "|"}:
            lines.append(cells[column].split("`")[1])
    return lines


# ---------------------------------------------------------------------------------------------- commands


class _Parsed(Exception):
    """A module's parser accepted the arguments (or, for a partial command, was reached): the command stops."""


def _options_of(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings of a parser and of its subcommands' parsers."""
    options = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                options |= _options_of(sub)
    return options


def _unknown_options(words: list[str], known: set[str]) -> str:
    unknown = [w.split("=")[0] for w in words if w.startswith("-") and w.split("=")[0] not in known]
    return f"unknown options {unknown}" if unknown else ""


def _parse_only(module: str, args: list[str], whole: bool) -> str:
    """Runs MODULE's main on `args` until its parser: '' when it parses them (a partial command: when each
    option it names is one of the parser's), else the parser's message."""
    parse = argparse.ArgumentParser.parse_args

    def parse_and_stop(parser, argv=None, namespace=None):
        raise _Parsed(parse(parser, argv, namespace) if whole else _unknown_options(args, _options_of(parser)))

    loaded = importlib.import_module(module)
    if not hasattr(loaded, "main"):  # a package's __main__
        loaded = importlib.import_module(f"{module}.__main__")
    if hasattr(loaded, "COMMANDS"):  # a dispatcher (benchmarks.probes NAME ...)
        return _dispatched(loaded.COMMANDS, args)
    err = io.StringIO()
    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_and_stop), contextlib.redirect_stderr(err):
        try:
            loaded.main(args)
        except _Parsed as parsed:
            return parsed.args[0] if isinstance(parsed.args[0], str) else ""
        except SystemExit:
            return err.getvalue().strip().splitlines()[-1]
    return f"{module} ran past its parser"


def _dispatched(commands: dict[str, str], args: list[str]) -> str:
    """A dispatcher's command: its name is one of `commands`, each option it names is one its module adds
    (read from the module's source: a probe's module imports TensorFlow, seconds)."""
    if args[0] not in commands:
        return f"unknown command {args[0]!r}"
    with open(importlib.util.find_spec(commands[args[0]]).origin, encoding="utf-8") as f:
        source = f.read()
    unknown = [a.split("=")[0] for a in args[1:] if a.startswith("-") and f'"{a.split("=")[0]}"' not in source]
    return f"unknown options {unknown}" if unknown else ""


def trainer_refusal(args: list[str], whole: bool = True) -> str:
    """'' when the trainer takes these flags (a partial command: absl parses them), else its message."""
    from absl import flags

    from launch.submit import sbatch, slurm
    from trainer import cli

    if cli.help_request(["trainer", *args]):
        return ""
    try:
        if whole:
            slurm._trainer_flags(args)
        else:
            slurm._trainer_flags([])  # defines the flags
            flags.FLAGS.unparse_flags()
            flags.FLAGS(["trainer", *args])
    except (sbatch.SpecError, flags.Error) as e:
        return str(e)
    return ""


def _launcher(args: list[str], whole: bool) -> str:
    """'' when `launch.slurm --dry_run` renders the script (a partial command: when its own options are known
    and absl parses the trainer's), else its message."""
    from launch.submit import slurm

    split = args.index("--") if "--" in args else len(args)
    if not whole:  # what the launcher does not know may be the trainer's, after an elided `--`
        ours = [a for a in args[:split] if a.split("=")[0] in _options_of(slurm._parser())]
        return trainer_refusal([a for a in args if a not in ours and a != "--"], False)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        code = 2
        code = slurm.main([*args[:split], "--dry_run", *args[split:]])
    return err.getvalue().strip() if code else ("" if "#SBATCH" in out.getvalue() else out.getvalue())


def _placeholder(word: str) -> str:
    name, equals, value = word.rpartition("=")
    if equals and value in PLACEHOLDERS:
        return f"{name}={PLACEHOLDERS[value]}"
    return PLACEHOLDERS.get(word, word.split("|")[0])


def arguments(command: str) -> tuple[str, list[str]]:
    """The module and its arguments, a synopsis's brackets opened (`[--x=a|b]` -> `--x=a`), `...` dropped."""
    words = shlex.split(command.replace("[", " ").replace("]", " "))
    words = [_placeholder(w) for w in words if w != "..."]
    start = words.index("-m")
    return words[start + 1], [w.replace("$USER", "me") for w in words[start + 2 :]]


def refusal(command: str, whole: bool = True) -> str:
    """'' when the command's module accepts its arguments, else the module's message."""
    module, args = arguments(command)
    if not args:  # the command named in prose, not run: its module must exist
        return "" if importlib.util.find_spec(module) else f"no module {module}"
    if module == "trainer":
        return trainer_refusal(args, whole)
    if module == "launch.slurm":
        return _launcher(args, whole)
    return _parse_only(module, args, whole)
