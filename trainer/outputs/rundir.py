"""What a `--model_dir` keeps about the run it holds: one live run at a time (a lock), the settings that
define the run (`run.json`), and the flags of every start (`flags.txt`, `flags.history`).

A run's directory is its identity: a requeued job, a manual rerun and a second experiment all find the same
checkpoints there. So a second live run is refused (naming the holder), and a resume whose settings would
change what is being trained (seed, model, data, augmentation, batch, optimizer, schedule...) is refused with
the list of differences unless `--allow_flag_changes` is given; augmentation and normalization are compared as
resolved (`--augment=auto` is what it chose for the model). Which settings may change on resume is a column of
the flag table (`trainer.settings.table`) and, for the devices, the update mode's (`trainer.step.modes`).
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket

import tasks
from trainer.outputs import checkpoint_files, report
from trainer.settings import table
from trainer.settings.config import ConfigError, Normalization, RunConfig, flatten
from trainer.settings.flag import FIXED
from trainer.settings.preprocess import resolve_augment
from trainer.step.core import micro_batch, tree
from trainer.step.modes import Plan, mode_for

LOCK_FILE = ".lock"
RUN_FILE = "run.json"
# Settings that define the run and are not flags: the number of tasks (a sync run's mode lets it change).
DERIVED = ("towers.num_tasks",)
# Settings of the code, not of any flag, that decide the bits: the order the K micro-batch gradients are summed
# in (`trainer.step.core.tree`), with how a refused resume names it.
CODE = {"towers.gradient_order": tree.ORDER, "towers.loss_reduction": micro_batch.LOSS_REDUCTION}
CODE_NAMES = {
    "towers.gradient_order": "the order of the gradient sum (docs/determinism.md)",
    "towers.loss_reduction": "how the loss is reduced over the global batch (docs/tasks.md)",
}
# What the runs before a setting existed did, where a run.json without it must not be read as today's default:
# before --augment and --normalize (commit b1283dc) images were scaled to [0, 1] (/255) and nothing else, and
# --augment=auto now augments resnet20 and resnet50; before towerflow 0.2 gradients were summed left to right;
# before 0.5 each micro-batch's loss was its mean, and the gradient the mean of the K micro-batches' gradients.
PREDATES = {
    "data.augment": "none",
    "data.normalize": "none",
    "towers.gradient_order": "chain",
    "towers.loss_reduction": "mean_of_micro_batch_means",
}
# Settings whose recorded value reproduces the run when given on the command line: a flags.txt written before
# the setting existed does not hold it, so --flagfile alone would not.
REPRODUCE = ("data.augment", "data.normalize")


class RunDirError(ConfigError):
    """The model_dir is in use by another live run, or holds a run these flags would change."""


class RunLock:
    """An exclusive `flock` on MODEL_DIR/.lock for as long as the run lives. The kernel releases it when the
    process ends, however it ends, so a crashed run's lock never blocks the next one. The file names the
    holder (host, pid, Slurm job, start time) for the message a refused run gets."""

    def __init__(self, model_dir: str):
        self.path = os.path.join(model_dir, LOCK_FILE)
        self._fd: int | None = None

    def __enter__(self):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirError(
                f"another live run holds {self.path} ({holder}); wait for it to end, or use another --model_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, _holder().encode())
        self._fd = fd
        return self

    def __exit__(self, *exc):
        os.close(self._fd)  # releases the lock; the file stays (removing it would race with a new holder)
        self._fd = None
        return False


def _holder() -> str:
    job = os.environ.get("SLURM_JOB_ID")
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    slurm = f", slurm job {job}" if job else ""
    return f"host {socket.gethostname()}, pid {os.getpid()}{slurm}, since {started}"


def defining_settings(plan: Plan) -> dict:
    """The settings that define what `plan` trains, flattened (`optimizer.learning_rate`, ...): the flag table's
    settings a resume may not change (`trainer.settings.table`, FIXED) and the task count, less what its update
    mode lets change (`UpdateMode.resume_may_change`), with `towers.num_micro_batches` for the 0 that means one
    per tower and `towers.tensor_shards` for the 0 that means T."""
    return _defining(plan.config, plan.mode.resume_may_change)


def _defining(config: RunConfig, may_change: frozenset[str]) -> dict:
    flat = flatten(config)
    names = [f.field for f in table.FLAGS if f.resume == FIXED and f.field != "towers.micro_batches" and not f.task]
    names += [f"task.{name}" for name, _ in config.task.options]  # the run's task's own arguments, as task.<name>
    defining = {k: flat[k] for k in (*names, *DERIVED) if k not in may_change}
    if "towers.num_micro_batches" not in may_change:
        defining["towers.num_micro_batches"] = config.towers.num_micro_batches
    defining["towers.tensor_shards"] = config.towers.tensor.shards  # 0 means T: the shards the model has
    defining.update({k: v for k, v in CODE.items() if k not in may_change})
    return _resolved({k: _jsonable(v) for k, v in sorted(defining.items())})


def _resolved(settings: dict) -> dict:
    """`settings` with --augment and --normalize as what they do to the images: auto resolved for the run's
    model, one spelling per normalization. The current settings are resolved already (`trainer.settings.resolve`);
    run.json files written before that held `auto` and the flag's spelling. Up to 3 micro-batches the
    left-to-right chain is the tree ((0 + 1) + 2), so the two orders are one there."""
    dense = settings["data.record_schema"] == "dense"
    resolved = {
        **settings,
        "data.augment": resolve_augment(settings["data.augment"], settings.get("model.name", ""), dense),
        "data.normalize": Normalization.parse(settings["data.normalize"]).text,
    }
    if "towers.gradient_order" in settings and settings["towers.num_micro_batches"] <= 3:
        resolved["towers.gradient_order"] = tree.ORDER
    return resolved


def _jsonable(value):
    return [_jsonable(v) for v in value] if isinstance(value, tuple) else value


def check_resume(
    plan: Plan,
    allow_changes: bool,
    log=print,
    task_facts: dict | None = None,
    model_facts: tuple[str, ...] = (),
    model_by_name: bool = True,
) -> None:
    """Refuses to resume a run whose defining settings `plan` changes; records them on a fresh start.
    `task_facts` (the task's `describe()`, e.g. its corpus's sha256) define the run too, as `task.<key>`: what
    the task says of its data, named as data, not as flags. A change of one of `model_facts` (the vocabulary the
    weights are for) is refused even with `allow_changes`: the checkpoint cannot be loaded into the new model.
    `model_by_name`: the task builds the model `--model` names (`Task.named_model`); else `model.name` is not
    the run's setting, neither recorded nor compared (a run.json of 0.7.0 or earlier recorded it for every task).

    Raises:
      RunDirError: listing each differing setting as `--flag: recorded -> now` and each data fact in words,
        unless `allow_changes` and no model fact changed.
    """
    config = plan.config
    model_dir = config.loop.model_dir
    path = os.path.join(model_dir, RUN_FILE)
    current = {**defining_settings(plan), **{f"task.{k}": _jsonable(v) for k, v in (task_facts or {}).items()}}
    not_the_runs = set() if model_by_name else {"model.name"}
    current = {k: v for k, v in current.items() if k not in not_the_runs}
    if checkpoint_files.any_saved(model_dir) and os.path.exists(path):
        recorded = _recorded_settings(path)
        free = plan.mode.resume_may_change | _other_tasks_arguments(recorded, current) | not_the_runs
        changed = sorted(k for k in (set(recorded) | set(current)) - free if recorded.get(k) != current.get(k))
        facts = _data_facts(changed, recorded, current, config)
        flags = [k for k in changed if k not in facts]
        changes = "; ".join(
            [_change(k, recorded, current, config) for k in flags] + _fact_words(facts, recorded, current)
        )
        if changes and (not allow_changes or any(k[len("task.") :] in model_facts for k in facts)):
            raise RunDirError(_refusal(model_dir, path, changes, facts, model_facts, recorded, flags))
        if changes:
            log(f"resuming with changed settings (--allow_flag_changes): {changes}")
        _warn_if_schedule_stretched(config, log)
    report.write_json(path, current)


def _data_facts(changed: list[str], recorded: dict, current: dict, config: RunConfig) -> list[str]:
    """The changed `task.<key>` that are facts of the data (the task's `describe()`), not its arguments."""
    arguments = {f"task.{name}" for name, _ in config.task.options} | {"task.name", "task.args"}
    return [k for k in changed if k.startswith("task.") and k not in arguments and k not in table.BY_FIELD]


def _refusal(model_dir, path, changes, facts, model_facts, recorded, flags) -> str:
    """The refused resume's message: what changed, and what to do; --allow_flag_changes only where it works."""
    flagfile = os.path.join(model_dir, "flags.txt")
    reproduce = "".join(f" --{table.flag_name(k)}={recorded[k]}" for k in flags if k in REPRODUCE)
    what = "holds a run of other data" if facts else "holds a run these flags would change"
    if any(k[len("task.") :] in model_facts for k in facts):
        return (
            f"{model_dir} {what} ({changes}): its weights are for another vocabulary, which these records' model "
            f"cannot load. Use a new --model_dir, or resume with the run's data and flags (--flagfile={flagfile})"
        )
    return (
        f"{model_dir} {what} ({changes}). Resume with its flags (--flagfile={flagfile}{reproduce}), use a new "
        f"--model_dir, or pass --allow_flag_changes to resume anyway (the run's settings are recorded in {path})"
    )


def _fact_words(facts: list[str], recorded: dict, current: dict) -> list[str]:
    """Each changed data fact as `the data's <name in words>: recorded -> now`, a hash by its first 12 digits, a long
    value (a model file's base64) by its length, or left out when its own sha256 is listed."""
    shown = [k for k in facts if f"{k}_sha256" not in facts]
    names = {k: k[len("task.") :].replace("_", " ") for k in shown}
    return [f"the data's {names[k]}: {_fact(recorded.get(k))} -> {_fact(current.get(k))}" for k in shown]


def _fact(value) -> str:
    if isinstance(value, list):
        return f"{len(value)} entries"
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    if isinstance(value, str) and len(value) > 40:
        return f"a value of {len(value)} characters"
    return "none" if value is None else str(value)


def _other_tasks_arguments(recorded: dict, current: dict) -> set[str]:
    """The `task.<name>` keys of built-in tasks' arguments that a run.json of 0.7.0 or earlier recorded for
    every run (the language model's sizes were engine settings then) and that are not the run's task's: not
    its settings, so not compared."""
    others = {f"task.{a.name}" for name, a in tasks.built_in_arguments() if name != recorded.get("task.name")}
    return {k for k in others if k in recorded and k not in current}


def _recorded_settings(path: str) -> dict:
    """run.json's settings, resolved; a setting newer than the recorded run had its default value then (less
    what the recorded run's own update mode leaves out; a task argument, the task's default), or what PREDATES
    says.

    Raises:
      RunDirError: the file is damaged (not UTF-8, not JSON, not an object, a value that does not parse); the
        message names it and how to go on without it.
    """
    try:
        with open(path, "rb") as f:
            recorded = json.loads(f.read().decode("utf-8"))
        if not isinstance(recorded, dict):
            raise ValueError(f"a JSON {type(recorded).__name__}, not an object")
        defaults = RunConfig()
        # The recorded run's mode, read from the file (not this run's: that one is `plan.mode`).
        recorded_mode = mode_for(recorded.get("towers.update_mode", defaults.towers.update_mode))
        # A built-in task's argument newer than the recorded run (--lm_preset) had its default then.
        arguments = tasks.options(recorded.get("task.name", defaults.task.name)).arguments
        newer = {f"task.{a.name}": a.default for a in arguments}
        return _resolved({**_defining(defaults, recorded_mode.resume_may_change), **PREDATES, **newer, **recorded})
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # ConfigError is a ValueError
        why = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        raise RunDirError(
            f"{path} is unreadable ({why}); it records the settings a resume must keep. Restore it, or delete "
            "it to resume without that check (flags.history holds the flags of every start)"
        ) from None


def _change(setting: str, recorded: dict, current: dict, config: RunConfig) -> str:
    """`--flag: recorded -> now`, saying where now's augmentation came from when --augment=auto chose it."""
    auto = f" (auto for {config.model.name})" if setting == "data.augment" and config.data.augment_auto else ""
    name = CODE_NAMES.get(setting, f"--{table.flag_name(setting)}")
    return f"{name}: {_short(recorded.get(setting))} -> {_short(current.get(setting))}{auto}"


def _short(value, limit: int = 120) -> str:
    """repr(value), its middle cut when long (a subword model, base64, is a task fact of ~100 KB)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2 :]} ({len(text)} characters)"


def _warn_if_schedule_stretched(config: RunConfig, log) -> None:
    """A cosine schedule decays to 0 at --train_steps: resuming with another budget recomputes it, and the
    learning rate jumps at the resumed step. Allowed (extending a run is common), but said."""
    previous = _recorded_flag(config.loop.model_dir, "train_steps")
    now = config.loop.train_steps
    if config.optimizer.schedule == "cosine" and previous not in (None, str(now)):
        log(
            f"warning: --train_steps {previous} -> {now}: the cosine schedule now decays to 0 at step {now}, not "
            f"{previous}, so the learning rate jumps at the resumed step (a V in TensorBoard's learning_rate)"
        )


def _recorded_flag(model_dir: str, name: str) -> str | None:
    """The value of --name in the flags.txt of the previous start, or None."""
    try:
        with open(os.path.join(model_dir, "flags.txt"), errors="replace") as f:  # a damaged file: no warning
            lines = f.read().splitlines()
    except OSError:
        return None
    values = [line.split("=", 1)[1] for line in lines if line.startswith(f"--{name}=")]
    return values[-1] if values else None


def record_flags(model_dir: str, flags_text: str) -> None:
    """Writes the flags of this start to flags.txt and appends them, with a header, to flags.history."""
    if not flags_text:
        return
    report.write_text(os.path.join(model_dir, "flags.txt"), flags_text)
    with open(os.path.join(model_dir, "flags.history"), "a") as f:
        f.write(f"# start: {_holder()}\n{flags_text}")
