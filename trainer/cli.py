"""The command line of `python -m trainer` before absl parses it: `--help`, `-v`, and flagfile precedence.

absl expands a `--flagfile` in place and lets the last occurrence of a flag win, so
`--model_dir=NEW --flagfile=OLD/flags.txt` would train into OLD. `command_line` reorders the arguments so
that every flagfile is expanded first and the flags typed on the command line come after it: a flag given on
the command line wins over the same flag in any flagfile, whatever the order. Imports no TensorFlow.
"""

from __future__ import annotations

import shutil
import textwrap

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


def command_line(argv: list[str], flag_values) -> list[str]:
    """argv with every `--flagfile` expanded (nested ones too) ahead of the flags typed on the command line,
    and a bare `-v` spelled `--verbosity=1`.

    Raises:
      absl.flags.Error: a flagfile cannot be read.
    """
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
    expanded = flag_values.read_flags_from_files(directives, force_gnu=True) if directives else []
    return [program, *expanded, *explicit, *rest]


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
