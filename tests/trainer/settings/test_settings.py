"""The settings layer (`trainer.settings`): one flag table from which the absl flags, `--help` groups, the
`RunConfig` and the resume check are generated, and `resolve`, the one step every entry point takes."""

import dataclasses

import pytest
from absl import flags

import tasks
from trainer.outputs import rundir
from trainer.settings import config as cfg
from trainer.settings import flags as tf_flags
from trainer.settings import table
from trainer.settings.flag import FIXED, FREE
from trainer.settings.resolve import resolve
from trainer.step import modes

NOT_FLAGS = {"flags_text", "towers.num_tasks", "data.augment_auto"}  # set by the entry point or by `resolve`
# The built-in tasks' own arguments: rows of the table whose values live in `task.options` (the named task's).
TASK_ARGUMENTS = {f.field for f in table.FLAGS if f.task}


def _fields() -> set[str]:
    config, names = cfg.RunConfig(), set()
    for group in dataclasses.fields(config):
        value = getattr(config, group.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, cfg.Normalization):
            names |= {f"{group.name}.{f.name}" for f in dataclasses.fields(value)}
        else:
            names.add(group.name)
    return names


def test_every_setting_is_one_row_of_the_table_and_every_row_one_setting():
    assert set(table.BY_FIELD) - TASK_ARGUMENTS == _fields() - NOT_FLAGS - {"task.options"}
    assert {f"task.{a.name}" for _, a in tasks.built_in_arguments()} == TASK_ARGUMENTS
    assert (
        len(table.BY_NAME) == len(table.BY_FIELD) == len(table.FLAGS) == 78
    )  # 74 + --lm_preset, --tensor_parallel, --tensor_shards, --tensor_layout
    assert set(table.GROUPS) == {flag.group for flag in table.FLAGS}
    assert {flag.resume for flag in table.FLAGS} == {FIXED, FREE}


def _parse(*args) -> cfg.RunConfig:
    tf_flags.define_flags()
    values = flags.FlagValues()
    for flag in table.FLAGS:  # a private copy of the defined flags, so tests never share parsed state
        values[flag.name] = flags.FLAGS[flag.name]
    values.unparse_flags()
    values(["trainer", *args])
    try:
        return tf_flags.config_from_flags(values)
    finally:
        values.unparse_flags()


def test_the_flags_defaults_are_the_settings_defaults():
    assert _parse() == cfg.RunConfig()


@pytest.mark.parametrize(
    ("arg", "field", "value"),
    [
        ("--num_gpus=3", "towers.num_towers", 3),
        ("--xla", "towers.jit_compile", True),
        ("--lr_schedule=piecewise", "optimizer.schedule", "piecewise"),
        ("--lr_boundaries=10,20", "optimizer.boundaries", (10, 20)),
        ("--lr_values=0.1,0.01,0.001", "optimizer.values", (0.1, 0.01, 0.001)),
        ("--image_size=32,24", "data.image_size", (32, 24)),
        ("--profile_steps=3,7", "loop.profile_steps", (3, 7)),
        ("--normalize=0.5,0.5,0.5,0.25,0.25,0.25", "data.normalize", cfg.Normalization((0.5,), (0.25,))),
        ("--cluster_timeout_sec=12.5", "cluster.timeout_sec", 12.5),
        ("--grappler=remapping=off", "runtime.grappler", "remapping=off"),
    ],
)
def test_each_flag_sets_exactly_its_setting(arg, field, value):
    config = _parse(arg)
    assert table.setting(config, field) == value
    changed = {name for name in _fields() if table.setting(config, name) != table.setting(cfg.RunConfig(), name)}
    assert changed == {field}


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("--lr_boundaries=10,x", "--lr_boundaries (10,x) must be comma-separated integers"),
        ("--profile_steps=1,2,3", "--profile_steps (1,2,3) must be two steps A,B"),
        ("--image_size=32", "--image_size (32) must be two positive integers H,W"),
        ("--normalize=0.5", "--normalize ('0.5') must be none, imagenet, or MEAN,STD"),
    ],
)
def test_a_value_that_does_not_parse_names_its_flag(arg, message):
    with pytest.raises(cfg.ConfigError) as e:
        _parse(arg)
    assert str(e.value).startswith(message)


def test_help_groups_and_the_resume_flags_come_from_the_table():
    tf_flags.define_flags()
    assert tf_flags.GROUP_FLAGS["cluster"] == ("cluster_port", "cluster_timeout_sec", "peer_timeout_sec")
    assert tf_flags.GROUP_FLAGS["towers"][:3] == ("num_gpus", "device", "parameter_device")
    allow = flags.FLAGS["allow_flag_changes"].help
    for flag in table.FLAGS:
        assert (f"--{flag.name}," in allow or f"--{flag.name};" in allow) == (
            flag.resume == FREE and flag.name != "allow_flag_changes"
        ), flag.name


def test_resolve_decides_auto_augmentation_once_and_is_idempotent():
    config = resolve(cfg.RunConfig(model=cfg.ModelConfig("resnet20")), num_tasks=2)
    assert (config.data.augment, config.data.augment_auto, config.towers.num_tasks) == ("crop_flip", True, 2)
    assert resolve(config) == config
    explicit = resolve(cfg.RunConfig(model=cfg.ModelConfig("resnet20"), data=cfg.DataConfig(augment="none")))
    assert (explicit.data.augment, explicit.data.augment_auto) == ("none", False)
    dense = resolve(cfg.RunConfig(data=cfg.DataConfig(record_schema="dense")))
    assert dense.data.augment == "none"


def test_resume_records_exactly_the_fixed_settings():
    recorded = rundir.defining_settings(modes.settle(cfg.RunConfig()))
    fixed = {f.field for f in table.FLAGS if f.resume == FIXED and not f.task} - {"towers.micro_batches"}
    sync_free = {"towers.num_towers", "towers.num_tasks"}
    code = {"towers.gradient_order", "towers.loss_reduction"}  # recorded from the code, not a flag (rundir.CODE)
    assert set(recorded) == (fixed | {"towers.num_micro_batches"} | code) - sync_free
    assert recorded["data.normalize"] == "none" and recorded["towers.num_micro_batches"] == 1
    assert recorded["towers.gradient_order"] == "tree" and recorded["towers.loss_reduction"] == "weighted_sum"


def test_a_built_in_tasks_arguments_are_its_own_settings():
    """The language model's sizes: flags of the table, checked before TensorFlow, its settings only when --task
    names it (run.json records them then, and a user task's does not)."""
    lm = _parse("--task=lm", "--lm_width=64", "--lm_heads=2")
    assert lm.task.option_dict == {
        "preset": "none", "layers": 4, "heads": 2, "width": 64, "context": 64, "positions": "learned",
        "dropout": 0.0,
    }  # fmt: skip
    assert table.setting(lm, "task.width") == 64
    # another task's argument: refused when set away from its default (a run's flags.txt lists every flag)
    assert _parse("--lm_width=128").task.options == ()  # the default task declares no such argument
    refused = r"^--lm_width \(64\) is an argument of --task=lm, and this run's task is '{}': drop the flag, or "
    refused += "pass --task=lm$"
    with pytest.raises(cfg.ConfigError, match=refused.format("classify")):
        _parse("--lm_width=64")
    user_task = "tests.support.tasks_example:Regression"
    with pytest.raises(cfg.ConfigError, match=refused.format(user_task)):
        _parse(f"--task={user_task}", "--lm_width=64")
    user = _parse(f"--task={user_task}")
    assert user.task.options == ()
    lm_recorded = rundir.defining_settings(modes.settle(resolve(cfg.RunConfig(task=cfg.TaskConfig(name="lm")))))
    assert (lm_recorded["task.width"], lm_recorded["task.heads"]) == (128, 4)
    user_recorded = rundir.defining_settings(modes.settle(resolve(user)))
    assert not [k for k in user_recorded if k in TASK_ARGUMENTS]
    with pytest.raises(cfg.ConfigError, match=r"^--lm_heads \(3\) must divide --lm_width \(64\)$"):
        resolve(_parse("--task=lm", "--lm_width=64", "--lm_heads=3"))
    with pytest.raises(cfg.ConfigError, match=r"^--lm_dropout \(1.5\) must be in \[0, 0.99\]$"):
        resolve(_parse("--task=lm", "--lm_dropout=1.5"))


def test_the_gpt2_small_preset_sets_the_sizes_a_size_flag_away_from_its_default_overrides():
    """--lm_preset decides in one place (tasks.lm_options._preset_sizes) and run.json records the sizes it
    gave; a size flag set away from its default is the user's; the task's rules check the sizes that result."""
    sizes = lambda config: tuple(config.task.option_dict[k] for k in ("layers", "heads", "width", "context"))  # noqa: E731
    assert sizes(resolve(_parse("--task=lm", "--lm_preset=gpt2-small"))) == (12, 12, 768, 1024)
    assert sizes(resolve(_parse("--task=lm", "--lm_preset=gpt2-small", "--lm_context=256"))) == (12, 12, 768, 256)
    assert sizes(resolve(_parse("--task=lm", "--lm_preset=gpt2-small", "--lm_layers=2"))) == (2, 12, 768, 1024)
    assert sizes(resolve(_parse("--task=lm"))) == (4, 4, 128, 64)  # no preset: the defaults
    library = resolve(cfg.RunConfig(task=cfg.TaskConfig(name="lm", options={"preset": "gpt2-small"})))
    assert sizes(library) == (12, 12, 768, 1024) and resolve(library) == library  # filled once, then unchanged
    recorded = rundir.defining_settings(modes.settle(library))
    assert (recorded["task.preset"], recorded["task.width"]) == ("gpt2-small", 768)
    with pytest.raises(cfg.ConfigError, match=r"^--lm_heads \(5\) must divide --lm_width \(768\)$"):
        resolve(_parse("--task=lm", "--lm_preset=gpt2-small", "--lm_heads=5"))
    with pytest.raises(flags.IllegalFlagValueError, match=r"--lm_preset=gpt2-large: value should be one of"):
        _parse("--task=lm", "--lm_preset=gpt2-large")


def test_the_language_models_positions_are_the_models():
    from models import transformer  # noqa: PLC0415 (Keras)
    from tasks import lm_options  # noqa: PLC0415

    assert lm_options.POSITIONS == transformer.POSITIONS
