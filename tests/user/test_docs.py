"""Every command and every quoted message of README.md and docs/*.md, checked against the software, so the
docs cannot drift from it.

Commands: each `python -m MODULE ...` of a fenced ```bash block and of an inline `...` span, checked in this
process by its own module without running it (tests/support/doc_lines.py): a trainer command by the
launcher's validation of the flags it submits (absl's parse and the flag table's checks, no TensorFlow), so a
renamed flag or a value the trainer refuses fails here; `launch.slurm` for real with `--dry_run`; every other
module by its own parser. Optional parts of a synopsis (`[--tokens N]`) are checked as if given, with a value
for each placeholder. The bad-input invocations are tests/user/test_bad_input.py's rows, which run them.

Messages: each `error: ...` or `warning: ...` a page quotes, and each line of docs/tasks.md's refusal table, is
placed by `MESSAGES` (the message made in this process, or the test that asserts it: its pieces between `...`
and placeholders must be in that test's source) or by a bad-input row. A command or a message that nothing
places fails the test, so a new line in the docs needs an entry here; `ILLUSTRATIVE` names the few that are
not meant to run, each with its reason.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

import pytest

from tests.support.doc_lines import (
    PAGES,
    PYTHON_M,
    arguments,
    doc_commands,
    doc_quotes,
    page_text,
    refusal,
    spaced,
    trainer_refusal,
)
from tests.support.paths import ROOT
from tests.user import test_bad_input

# Commands not meant to run as written: (start of the command, why).
ILLUSTRATIVE = {
    "python -m pytest": "runs the test suite itself",
    "python -m trainer --flagfile=DIR/flags.txt": "DIR stands for a run's directory, whose flags.txt it reads",
    "python -m benchmarks.probes NAME": "NAME stands for a probe's name (the help lists them)",
    "python -m benchmarks.machines NAME": "NAME stands for a command's name (the help lists them)",
    "python -m tests.support.corrupt_trials --trials=N": "N stands for a number of trials",
    "python -m trainer.system.console LEVEL": "the stderr filter towerflow starts itself, reading a task's stderr",
}


# Lines of bash blocks that are not towerflow's commands: (start of the line, why it is not run).
SHELL_LINES = {
    "pip install": "installs towerflow: every other test runs in what it installed",
    "#!/bin/bash": "a batch script's first line",
    "#SBATCH": "sbatch's directives in the script written by hand (the rendered script is compared whole)",
}


def _bad_input_invocations() -> set[str]:
    shown = {"tmp": "/x", "ro": "/ro"}
    return {" ".join(test_bad_input._filled(a, shown) for a in row[1]) for row in test_bad_input.ROWS if row[1]}


@pytest.mark.quick
def test_every_command_of_the_docs_is_accepted():
    commands = doc_commands()
    assert len(commands) > 100, len(commands)
    bad_input = _bad_input_invocations()
    refused = []
    for page, command, whole in commands:
        module, args = arguments(command)
        if any(command.startswith(c) for c in ILLUSTRATIVE) or " ".join(args) in bad_input and module == "trainer":
            continue
        message = refusal(command, whole)
        if message:
            refused.append(f"{page}: {command}: {message}")
    assert not refused, "\n".join(refused)


@pytest.mark.quick
def test_a_renamed_flag_in_a_doc_command_is_caught():
    """The check above can fail: a misspelt flag, a value out of range and an unknown option, per module."""
    assert "Unknown command line flag 'lm_layer'" in refusal("python -m trainer --task=lm --lm_layer=4")
    assert "--global_batch_size (100) must be" in refusal("python -m trainer --num_gpus=3 --global_batch_size=100")
    assert "unrecognized arguments: --vocab_sz=8" in refusal("python -m data.prepare text a.txt OUT --vocab_sz=8")
    assert "unrecognized arguments: --length" in refusal("python -m tasks.sample RUN --length 5")
    assert "Unknown command line flag 'bogus'" in refusal("python -m launch.slurm --model_dir=/tmp/r -- --bogus")
    assert "Unknown command line flag 'nodez'" in refusal("python -m launch.slurm --nodez=2 ...", whole=False)
    assert "unknown options ['--vocab']" in refusal("python -m data.prepare text --vocab=8", whole=False)
    assert "Unknown command line flag 'lm_layer'" in refusal("python -m trainer --lm_layer=4", whole=False)
    assert "unknown options ['--step_tim']" in refusal("python -m benchmarks.probes pipeline_memory --step_tim", False)
    assert "unknown command 'lm_memroy'" in refusal("python -m benchmarks.probes lm_memroy", whole=False)


@pytest.mark.quick
def test_the_illustrative_commands_are_in_the_docs():
    commands = [c for _, c, _ in doc_commands()]
    stale = [c for c in ILLUSTRATIVE if not any(d.startswith(c) for d in commands)]
    assert not stale, stale


@pytest.mark.quick
def test_the_several_machine_script_is_what_the_launcher_renders(capsys):
    """docs/slurm.md's script for two nodes is `launch.slurm --dry_run`'s for the options it names, without
    the rendered script's comments, `set -eu`, `cd` and start line, in the doc's spelling of paths."""
    from launch.submit import slurm

    page = page_text("docs/slurm.md")
    script = next(b for b in re.findall(r"```bash\n(#!/bin/bash\n.*?)```", page, re.S) if "--nodes=2" in b)
    options = re.search(r"`python -m launch\.slurm (--model_dir[^`]*)` renders this script", page).group(1)
    assert slurm.main(["--dry_run", *spaced(options).replace("$USER", "me").split(" ")]) == 0, capsys.readouterr()
    rendered = capsys.readouterr().out.replace(sys.executable, "python")
    rendered = rendered.replace("--output=/scratch/me/", "--output=/scratch/%u/").replace(
        "/scratch/me/", "/scratch/$USER/"
    )
    skipped = ("# ", "set -eu", "cd ", 'echo "=== towerflow: job')
    lines = [line for line in rendered.splitlines() if not line.startswith(skipped)]
    assert script.splitlines() == lines


@pytest.mark.quick
def test_every_line_of_a_bash_block_is_checked():
    """A bash block's line is a `python -m` command (checked above), a line of the rendered script (compared
    above), or one of SHELL_LINES."""
    unplaced = []
    for page in PAGES:
        for block in re.findall(r"^```bash\n(.*?)^```", page_text(page), re.S | re.M):
            rendered = block.startswith("#!/bin/bash\n") and "--nodes=2" in block
            for line in block.replace("\\\n", " ").splitlines():
                if not (rendered or PYTHON_M.search(line) or line.startswith(tuple(SHELL_LINES))):
                    unplaced.append(f"{page}: {line}")
    assert not unplaced, unplaced


# ---------------------------------------------------------------------------------------------- messages


@dataclasses.dataclass(frozen=True)
class Flags:
    """The trainer's refusal of these flags, made in this process."""

    args: tuple[str, ...]

    def text(self) -> str:
        return "error: " + trainer_refusal(list(self.args)).removeprefix("trainer flags: ")


@dataclasses.dataclass(frozen=True)
class Source:
    """The message is made by this module, or asserted by this test (a message of a long run); `holes` are what
    the doc shows of one run's values (a path, a count, a time) where the source has a placeholder."""

    path: str
    holes: tuple[str, ...] = ()

    def text(self) -> str:
        with open(os.path.join(ROOT, self.path), encoding="utf-8") as f:
            source = f.read()
        source = re.sub(r"\"\s*\n\s*f?\"", "", source)  # strings cut over lines, joined
        return spaced(source.replace("{{", "{").replace("}}", "}"))


def _pieces(quote: str, holes: tuple[str, ...]) -> list[str]:
    pattern = "|".join(re.escape(h) for h in ("...", *holes))
    return [p.strip(" ,") for p in re.split(pattern, quote) if len(p.strip(" ,")) >= 8]


def placed(quote: str, check: Flags | Source) -> list[str]:
    """The pieces of `quote` the check's text lacks (a Flags message must hold them in order)."""
    text = check.text()
    if isinstance(check, Flags):
        quote = quote if quote.startswith("error: ") else f"error: {quote}"
    if isinstance(check, Source):  # the entry point adds "error: ", srun's --label the task's number
        quote = re.sub(r"^(\d: )?(error|warning): ", "", quote)
    missing, at = [], 0
    for piece in _pieces(quote, getattr(check, "holes", ())):
        found = text.find(piece, at if isinstance(check, Flags) else 0)
        if found < 0:
            missing.append(piece)
        at = max(at, found)
    return missing


FEATURE_CHECKS, TASK_ERRORS = "tests/tasks/test_feature_checks.py", "tests/tasks/test_task_errors.py"
PEERS, TWO_NODE = "trainer/system/peers.py", "tests/launch/test_two_node.py"
# The start of each quoted message that no bad-input row makes -> where it is made or asserted.
MESSAGES: dict[str, Flags | Source] = {
    # README.md, docs/console.md, docs/data.md, docs/pipelines.md
    "warning: --mixed_precision=fp16 on CPU towers": Source(
        "trainer/outputs/costs.py",
        ("--mixed_precision=fp16 on CPU", "0.255 (cnn-digits)", "(benchmarks/results/headline.md fp16_vs_fp32, ...); "),
    ),
    "error: task 'lm': feature 'token' of": Source(
        "data/features.py", ("'lm'", "'token'", "data/x.tfrecord", "tokens)")
    ),
    "error: --train_data task 'langid'": Source(
        "data/feature_pipeline.py",
        ("--train_data", "'langid'", "'bytes'", "/x/train-00000.tfrecord record 17", "8364", "[0, 256)"),
    ),
    "error: --pipeline_cuts: 'bogus' is not a place": Source(
        "models/stages.py",
        ("'bogus'", "'cnn'", "conv1, bn1, relu1, conv2, bn2, relu2, pool, dropout1, flatten, dense1, dropout2"),
    ),
    "error: a step needs ~18.8 MiB": Source(
        "trainer/step/memory/device_memory.py",
        ("18.8", "/device:CPU:0", "12.5", "1 micro", "6.3", "activations", "=10;"),
    ),
    # docs/slurm.md
    "error: worker task 1 (node10:12984) has not": Source(
        PEERS, ("worker task 1 (node10:12984)", "61", "=60", "frozen", "75")
    ),
    "error: no training step finished for 61 s": Source(
        "trainer/system/stall.py", ("61", "one of the tasks (task 0 node9:12984, task 1 node10:12984)")
    ),
    "0: error: worker task 1 (tfn2:20064) has not": Source(TWO_NODE, ("20064", "9 s")),
    "1: error: the chief (task 0, tfn1:20064) has not": Source(TWO_NODE, ("20064", "8 s")),
    "0: error: worker task 1 (tfn2:20056) has not": Source(TWO_NODE, ("20056", "8 s")),
    # docs/tasks.md: the padding warning and the refusal table
    "warning: task 'tokens': the model's output": Source("trainer/loop/padding.py", ("'tokens'", "D", "8 and 16")),
    "--task='nonsense'": Source(TASK_ERRORS),
    "--task='nosuch.module:X'": Source(TASK_ERRORS),
    "--task='tasks.base:nothing'": Source(TASK_ERRORS, ("ROOT",)),
    "--task='json:loads'": Source(TASK_ERRORS),
    "--task_args (oops)": Flags(("--task_args=oops",)),
    "task 'regression': feature 'x' of FILE holds": Source(TASK_ERRORS, ("FILE",)),
    "--train_data task 'padded'": Source(
        "data/features.py", ("--train_data", "'padded'", "'x'", "FILE record 37", "12", "8")
    ),
    "task 'tokens': feature 'tokens' of FILE is missing": Source(FEATURE_CHECKS, ("FILE",)),
    "... of FILE record 7 is missing": Source(FEATURE_CHECKS, ("FILE",)),
    "--train_data task 'tokens': feature 'tokens' of FILE record 37": Source(FEATURE_CHECKS, ("FILE", "record 37")),
    "task 'tokens': feature 'tokens' of FILE record 3 holds": Source(FEATURE_CHECKS, ("FILE", "record 3")),
    "task 'tokens': feature 'tokens' of FILE holds 40": Source(FEATURE_CHECKS, ("task 'tokens'", "FILE")),
    "task 'tokens': the model looked up 40": Source(FEATURE_CHECKS),
    "a fixed feature cannot be optional": Source("data/schema.py"),
    "task 'NAME': features() must return": Source("data/schema.py", ("task 'NAME'",)),
    "task 'regression': metrics() returned": Source(TASK_ERRORS),
    "Branching.loss in ROOT/": Source(TASK_ERRORS, ("ROOT",)),
    "task 'regression': serving() returns no signature": Source(TASK_ERRORS),
    "/home/me/proj/tasks.py has the name": Source(
        "trainer/system/packages.py", ("/home/me/proj/tasks.py", "'tasks'", "my_tasks.py")
    ),
    "--lm_heads (3) must divide": Flags(("--task=lm", "--lm_heads=3", "--lm_width=128")),
    "--lm_width (64) is an argument of --task=lm": Flags(("--lm_width=64",)),
}


def _entry(quote: str) -> list[str]:
    return [start for start in MESSAGES if quote.startswith(start)]


def _by_bad_input(quote: str) -> bool:
    shown = {"tmp": "/x", "ro": "/ro", "held": "7000"}
    rows = [test_bad_input._filled(row[3], shown) for row in test_bad_input.ROWS]
    return any(quote.startswith(row) or (quote.endswith("...") and row.startswith(quote[:-3].strip())) for row in rows)


@pytest.mark.quick
def test_every_quoted_message_is_what_the_software_prints():
    quotes = doc_quotes()
    assert len(quotes) > 80, len(quotes)
    wrong = []
    for page, quote in quotes:
        if quote == "error: ...":  # the README's exit-code table: the form, not a message
            continue
        starts = _entry(quote)
        if not starts:
            if not _by_bad_input(quote):
                wrong.append(f"{page}: no test places {quote!r}: add it to MESSAGES")
            continue
        missing = placed(quote, MESSAGES[starts[0]])
        if missing:
            wrong.append(f"{page}: {quote!r}: not in what {MESSAGES[starts[0]]} says: {missing}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.quick
def test_a_message_the_software_does_not_print_is_caught():
    flags = Flags(("--task=lm", "--lm_heads=3", "--lm_width=128"))
    assert placed("--lm_heads (3) must divide --lm_width (128)", flags) == []
    assert placed("--lm_heads (3) must divide --lm_depth (128)", flags) == [
        "error: --lm_heads (3) must divide --lm_depth (128)"
    ]
    memory = Source("trainer/step/memory/device_memory.py", ("18.8",))
    assert placed("error: a step needs ~18.8 MiB on one device", memory) == ["MiB on one device"]


@pytest.mark.quick
def test_every_message_entry_is_quoted():
    quotes = [q for _, q in doc_quotes()]
    stale = [start for start in MESSAGES if not any(q.startswith(start) for q in quotes)]
    assert not stale, stale
