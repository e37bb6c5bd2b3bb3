"""The command line of `python -m trainer` before absl parses it: `--help`, `-v`, and flagfile precedence.

absl expands a `--flagfile` in place and lets the last occurrence of a flag win, so
`--model_dir=NEW --flagfile=OLD/flags.txt` would train into OLD. `command_line` reorders the arguments so
that every flagfile is expanded first and the flags typed on the command line come after it: a flag given on
the command line wins over the same flag in any flagfile, whatever the order. Imports no TensorFlow.
"""

from __future__ import annotations

import re
import shutil
import textwrap

from absl import flags

from trainer.system import stop

HELP_ARGS = ("-h", "--help", "-help", "-?", "--helpshort", "-helpshort")
FULL_HELP_ARGS = ("--helpfull", "-helpfull")
FLAGFILE = ("--flagfile", "-flagfile")
VERBOSE_SHORT = "-v"  # absl's short name of --verbosity; alone, as in most tools, it means --verbosity=1
USAGE = "usage: python -m trainer [--flag=value ...] [--flagfile=FILE ...] [-v] [-h | --helpfull]"
SUMMARY = (
    "Trains a Keras model data-parallel over N towers (GPUs, or logical CPU devices with --device=cpu) "
    "and writes checkpoints, TensorBoard events, metrics.json, flags.txt and a SavedModel to --model_dir."
)
FOOTER = (
    "--flagfile=FILE reads flags from FILE, one per line, # for comments (MODEL_DIR/flags.txt reproduces a "
    "run). A flag given on the command line wins over the same flag in a flagfile, whatever the order. "
    "-v or --verbosity=1 also shows TensorFlow's own log lines (hidden otherwise). --helpfull lists every "
    f"flag, absl's included. Exit codes: {stop.EXIT_OK} done, {stop.EXIT_FAILED} unexpected error, "
    f"{stop.EXIT_USAGE} bad flags or data, {stop.EXIT_DIVERGED} diverged, {stop.EXIT_RESUMABLE} stopped by a "
    "signal, rerun to resume."
)


def help_request(argv: list[str]) -> str:
    """'help' for towerflow's grouped flags (-h, --help), 'full' for absl's listing of every module's flags
    (--helpfull), '' for none."""
    options = _options(argv)
    if any(arg in HELP_ARGS for arg in options):
        return "help"
    return "full" if any(arg in FULL_HELP_ARGS for arg in options) else ""


class CommandLineError(ValueError):
    """A command line absl cannot parse, said in one line that names the flag or the file (exit 2)."""


def parse(argv: list[str], flag_values) -> list[str]:
    """Parses `argv` into `flag_values` (flagfiles first, see `command_line`); returns the program name.

    Raises:
      CommandLineError: an unknown flag, a value not of the flag's type or not in its list, an unreadable
        flagfile, or an argument that is not a flag.
    """
    expanded, origins = _expand(argv, flag_values)
    try:
        rest = flag_values(expanded)
    except flags.Error as e:
        raise CommandLineError(_said(e, flag_values, origins)) from None
    if len(rest) > 1:
        raise CommandLineError(f"unexpected arguments: {' '.join(rest[1:])} (flags take the form --name=value)")
    return rest


def command_line(argv: list[str], flag_values) -> list[str]:
    """argv with every `--flagfile` expanded (nested ones too) ahead of the flags typed on the command line,
    and a bare `-v` spelled `--verbosity=1`.

    Raises:
      CommandLineError: a flagfile cannot be read.
    """
    return _expand(argv, flag_values)[0]


def _expand(argv: list[str], flag_values) -> tuple[list[str], dict[str, str]]:
    """`command_line`'s argv, and the flagfile each flag read from one came from (name -> path)."""
    program, args = argv[0], list(argv[1:])
    rest = args[args.index("--") :] if "--" in args else []  # positional arguments stay last
    args = args[: len(args) - len(rest)]
    directives, explicit = [], []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in FLAGFILE and i + 1 < len(args):
            directives += args[i : i + 2]
            i += 2
            continue
        if arg.startswith(tuple(f"{f}=" for f in FLAGFILE)):
            directives.append(arg)
        elif arg == VERBOSE_SHORT and not _is_int(args[i + 1] if i + 1 < len(args) else ""):
            explicit.append("--verbosity=1")
        else:
            explicit.append(arg)
        i += 1
    expanded, origins = [], {}
    for path in _flagfiles(directives):
        read = _read_flagfile(path, flag_values)
        origins.update({_flag_name(arg): path for arg in read if _flag_name(arg) not in origins})
        expanded += read
    return [program, *expanded, *explicit, *rest], origins


def _flagfiles(directives: list[str]) -> list[str]:
    """The paths of `--flagfile=PATH` and `--flagfile PATH` directives."""
    paths, i = [], 0
    while i < len(directives):
        name, eq, value = directives[i].partition("=")
        paths.append(value if eq else directives[i + 1])
        i += 1 if eq else 2
    return paths


def _read_flagfile(path: str, flag_values) -> list[str]:
    if not path:
        raise CommandLineError("--flagfile needs a file name (--flagfile=FILE)")
    try:
        return flag_values.read_flags_from_files([f"--flagfile={path}"], force_gnu=True)
    except flags.CantOpenFlagFileError as e:
        found = re.search(r"\[Errno \d+\] (.*): '(.*)'$", str(e))
        why, where = found.groups() if found else (str(e), path)
        named = "" if where == path else f" (named in {path})"
        raise CommandLineError(f"--flagfile={where}{named}: cannot read it: {why}") from None
    except UnicodeDecodeError:
        raise CommandLineError(f"--flagfile={path}: not a text file of flags (it is not UTF-8)") from None


def _flag_name(arg: str) -> str:
    return arg.lstrip("-").partition("=")[0]


def _said(error: Exception, flag_values, origins: dict[str, str]) -> str:
    """absl's flag error in our words: the flag, what it must be, and the flagfile it came from."""
    text = str(error)
    if isinstance(error, flags.UnrecognizedFlagError):
        guess = re.search(r"Did you mean: (\S+)", text)
        hint = f" (did you mean --{guess.group(1).rstrip(',')}?)" if guess else "; --help lists the flags"
        return f"unknown flag --{error.flagname}{_origin(error.flagname, origins)}{hint}"
    bad = re.match(r"flag --(\w+)=(.*?): ", text)
    if bad:
        name, value = bad.groups()
        return f"--{name}={value}{_origin(name, origins)} {_expected(flag_values[name])}"
    missing = re.match(r"Missing value for flag --(\w+)|--(flagfile) with no argument", text)
    if missing:
        name = missing.group(1) or missing.group(2)
        return f"--{name} needs a value (--{name}={'FILE' if name == 'flagfile' else 'VALUE'})"
    return text.replace("\n", " ")


def _origin(name: str, origins: dict[str, str]) -> str:
    return f" (in --flagfile={origins[name]})" if name in origins else ""


def _expected(flag) -> str:
    enum_values = getattr(flag.parser, "enum_values", None)
    if enum_values:
        return f"must be one of {', '.join(v or repr('') for v in enum_values)}"
    if flag.boolean:
        return f"must be true or false (or --{flag.name} / --no{flag.name})"
    kind = flag.flag_type()
    return {"int": "must be an integer", "float": "must be a number"}.get(kind, f"is not a valid {kind}")


def _options(argv: list[str]) -> list[str]:
    args = list(argv[1:])
    return args[: args.index("--")] if "--" in args else args


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def help_text(flag_values, groups: dict[str, tuple[str, ...]], blurbs: dict[str, str], width: int = 0) -> str:
    """towerflow's flags under one heading per group, each with its type, default and help, wrapped to `width`
    columns (0: the terminal's)."""
    width = width or max(60, shutil.get_terminal_size((100, 24)).columns - 1)
    lines = [USAGE, "", *textwrap.wrap(SUMMARY, width)]
    for heading, names in groups.items():
        lines += ["", f"{heading}: {blurbs.get(heading, '')}".rstrip(": ")]
        for name in names:
            lines += _flag_lines(flag_values[name], width)
    return "\n".join([*lines, "", *textwrap.wrap(FOOTER, width)]) + "\n"


def full_help_text(flag_values) -> str:
    """absl's --helpfull listing (every flag of every module, absl's and TensorFlow's included) after our
    usage line, instead of the developer docstring of `trainer/__main__.py` absl would print."""
    return f"{USAGE}\n\nflags:\n{flag_values.get_help()}\n"


def _flag_lines(flag, width: int) -> list[str]:
    head = textwrap.wrap(f"{_synopsis(flag)}  (default: {_default(flag)})", width, initial_indent="  ")
    text = flag.help.removeprefix(f"<{'|'.join(getattr(flag.parser, 'enum_values', None) or ())}>: ")
    body = textwrap.wrap(text, width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return [*head, *body]


def _synopsis(flag) -> str:
    if flag.boolean:
        return f"--[no]{flag.name}"
    enum_values = getattr(flag.parser, "enum_values", None)
    if enum_values:
        kind = "{" + "|".join(v or "''" for v in enum_values) + "}"
    else:
        kind = {"int": "INT", "float": "FLOAT", "string": "TEXT"}.get(flag.flag_type(), "A,B,...")
    return f"--{flag.name}={kind}"


def _default(flag) -> str:
    value = flag.default
    if flag.boolean:
        return "true" if value else "false"
    if value is None or value == "" or value == []:
        return "empty"
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)
