"""The flag table: every flag of `python -m trainer`, once.

Each row names the flag, the setting it fills (`group.field` of `RunConfig`, whose dataclass default is the
flag's default and whose type is the flag's type), its `--help` group and text, whether a resume may change
it, and how its value is checked or parsed. From this table `trainer.settings.flags` defines the absl flags,
prints `--help` by group and builds the `RunConfig` by keyword; `trainer.settings.validate` checks each value;
`trainer.outputs.rundir` records and compares the settings a resume may not change. A new flag is one row
here and one field in `trainer.settings.config`.
"""

from __future__ import annotations

from trainer.settings import config as cfg
from trainer.settings import rows_pipeline, rows_running, rows_task, rows_training
from trainer.settings.flag import FREE, Flag

# `--help` heading -> the one-line description printed with it, in `--help` order.
GROUPS = {
    "towers": "devices, batch split, update mode, precision, reproducibility",
    "pipeline": "a model too large for one device, cut into stages",
    "data": "training and eval records",
    "augmentation": "what training images look like, and the decoded-record cache",
    "task": "the workload: a built-in task and its own arguments, or your own tasks.Task",
    "model": "what is trained",
    "optimizer": "update rule and learning-rate schedule",
    "loop and outputs": "how long, how often, what model_dir gets",
    "resume": "rerunning into an existing model_dir",
    "cluster": "several tasks: srun, TF_CONFIG",
    "runtime": "threads, GPU memory, oneDNN, cuDNN autotuning, graph rewrites",
}


FLAGS: tuple[Flag, ...] = (
    *rows_training.towers(),
    *rows_pipeline.pipeline(),
    *rows_pipeline.tensor(),
    *rows_training.data_(),
    *rows_training.augmentation(),
    *rows_task.task(),
    *rows_training.model_and_optimizer(),
    *rows_running.loop(),
    *rows_running.cluster_and_runtime(),
)
BY_NAME = {flag.name: flag for flag in FLAGS}
BY_FIELD = {flag.field: flag for flag in FLAGS}


def flag_name(setting: str) -> str:
    """The flag that sets `setting` ("towers.num_towers" -> "num_gpus"); the setting's last name otherwise."""
    flag = BY_FIELD.get(setting)
    return flag.name if flag else setting.split(".")[-1]


def help_text(flag: Flag) -> str:
    """The flag's help; --allow_flag_changes lists the flags a resume may change, from this table."""
    if flag.name != "allow_flag_changes":
        return flag.help
    free = ", ".join(f"--{f.name}" for f in FLAGS if f.resume == FREE and f.name != "allow_flag_changes")
    return (
        "Resume a --model_dir although these flags change settings that define its run (seed, model, data, "
        "augmentation, batch, micro-batches, optimizer, schedule, precision, update mode); without it such a "
        f"resume is refused with the list of differences. Always free to change: {free}; in sync mode also "
        "--num_gpus and the number of tasks."
    )


def setting(config: cfg.RunConfig, field: str):
    """The value of `field` ("group.field" or a top-level field) in `config`; a task argument's ("task.width")
    is in the task's options, or its default."""
    row = BY_FIELD.get(field)
    if row is not None and row.task:
        return config.task.option_dict.get(field.partition(".")[2], row.default)
    value = config
    for part in field.split("."):
        value = getattr(value, part)
    return value
