"""A run's decisions are made once, at its entry point, and carried down: the settings are resolved once, the
update mode is looked up by name once, and what `build` decides (placement, data settings) is made once and
kept in the `Trainer`. These tests count the deciding calls, so a consumer that re-derives one fails them."""

import ast
import collections
import os
import pathlib
import subprocess
import sys

import pytest

from tests.support.paths import ROOT
from trainer.settings import config as cfg
from trainer.settings import resolve as resolve_lib
from trainer.step import modes


class _CountingModes(dict):
    """`modes.MODES` that counts the look-ups by name in `counts["mode"]` (`mode_for` is the only reader)."""

    def __init__(self, modes_by_name: dict, counts: collections.Counter):
        super().__init__(modes_by_name)
        self.counts = counts

    def __getitem__(self, name):
        self.counts["mode"] += 1
        return super().__getitem__(name)


@pytest.fixture
def decisions(monkeypatch):
    """Counts the calls that decide: validations (every `resolve`, hence every `settle`), update-mode look-ups,
    placements, data settings and tasks made."""
    counts = collections.Counter()

    def counted(name, function):
        def call(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)

        return call

    import tasks
    from trainer.loop import records
    from trainer.system import devices

    monkeypatch.setattr(resolve_lib, "validate", counted("settings", resolve_lib.validate))
    monkeypatch.setattr(devices, "place", counted("placement", devices.place))
    monkeypatch.setattr(records, "data_settings", counted("data settings", records.data_settings))
    monkeypatch.setattr(tasks, "make_task", counted("task", tasks.make_task))
    monkeypatch.setattr(modes, "MODES", _CountingModes(modes.MODES, counts))
    return counts


def test_settle_returns_the_plan_with_the_mode_object_and_the_task_count():
    plan = modes.settle(cfg.RunConfig(model=cfg.ModelConfig("resnet20"), towers=cfg.TowerConfig()), num_tasks=2)
    assert plan.mode is modes.MODES["sync"] and plan.mode.name == "sync"
    assert plan.num_tasks == plan.config.towers.num_tasks == 2
    assert (plan.config.data.augment, plan.config.data.augment_auto) == ("crop_flip", True)  # resolved
    asynchronous = modes.settle(cfg.RunConfig(towers=cfg.TowerConfig(update_mode="async")), num_tasks=1)
    assert asynchronous.mode is modes.MODES["async"]
    with pytest.raises(cfg.ConfigError, match="--update_mode=async cannot be --deterministic"):
        modes.settle(cfg.RunConfig(towers=cfg.TowerConfig(update_mode="async"), deterministic=True))


def test_a_plan_is_used_as_it_is_and_a_raw_config_is_settled(decisions):
    plan = modes.settle(cfg.RunConfig())
    assert decisions["settings"] == 1
    assert modes.planned(plan) is plan
    assert decisions["settings"] == 1  # nothing decided again
    again = modes.planned(cfg.RunConfig())
    assert again == plan and again is not plan
    assert decisions["settings"] == 2


def test_train_decides_each_thing_once(make_config, decisions):
    from trainer.loop.run import train

    metrics = train(make_config(model={"name": "mlp"}, loop={"train_steps": 2}))
    assert metrics["global_step"] == 2
    assert dict(decisions) == {"settings": 1, "mode": 1, "placement": 1, "data settings": 1, "task": 1}


def test_build_takes_the_plan_without_settling_again(make_config, decisions):
    from trainer.loop.build import build

    plan = modes.settle(make_config(model={"name": "mlp"}, deterministic=False, towers={"update_mode": "async"}))
    trainer = build(plan)
    try:
        assert trainer.plan is plan and trainer.config is plan.config
        assert (decisions["settings"], decisions["mode"]) == (1, 1)  # settle's, none by build
        assert (decisions["placement"], decisions["data settings"], decisions["task"]) == (1, 1, 1)
        assert trainer.placement.towers == ("/device:CPU:0", "/device:CPU:1")
        assert len(trainer.iterators) == 2  # the async mode's answer: one stream per tower, from the plan
    finally:
        trainer.updater.close()


def test_the_entry_point_settles_once_and_hands_the_plan_to_train(tmp_path):
    """`python -m trainer` in a fresh interpreter, `train` replaced by a recorder: one validation, one mode
    look-up, and `train` gets the settled plan (with the cluster's task count and the flags recorded)."""
    probe = (
        "import sys\n"
        "from absl import app\n"
        "import trainer.__main__ as entry\n"
        "from trainer.settings import resolve\n"
        "from trainer.step import modes\n"
        "calls = []\n"
        "validate = resolve.validate\n"
        "resolve.validate = lambda config: calls.append('validate') or validate(config)\n"
        "class Counting(dict):\n"
        "    def __getitem__(self, name):\n"
        "        calls.append('mode')\n"
        "        return super().__getitem__(name)\n"
        "modes.MODES = Counting(modes.MODES)\n"
        "import trainer.loop.run as run\n"
        "run.train = lambda plan, cluster: calls.append(plan)\n"
        f"sys.argv = ['trainer', '--device=cpu', '--num_gpus=1', '--model=resnet20', '--model_dir={tmp_path}/run']\n"
        "try:\n"
        "    app.run(entry.main)\n"
        "except SystemExit as e:\n"
        "    plan = calls[-1]\n"
        "    print(e.code, calls[:-1], type(plan).__name__, plan.mode.name, plan.num_tasks, plan.config.data.augment,\n"
        "          '--model=resnet20' in plan.config.flags_text)\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "0 ['validate', 'mode'] Plan sync 1 crop_flip True", result.stderr[-2000:]


def _architecture() -> str:
    with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
        return f.read()


def test_the_map_lists_every_trainer_module_on_its_floor():
    """Every module of a floor is named in its row; a floor's folders (trainer/step's) as `folder/`, then theirs."""
    rows = [line for line in _architecture().splitlines() if line.startswith("| ")]
    for package in ("settings", "system", "step", "outputs", "loop"):
        (row,) = [line for line in rows if f"| `trainer/{package}` |" in line]
        top = pathlib.Path(ROOT, "trainer", package)
        missing = [m.name for m in top.glob("*.py") if m.name != "__init__.py" and f"`{m.name}`" not in row]
        for folder in sorted(p for p in top.iterdir() if (p / "__init__.py").is_file()):
            named = row.split(f"`{folder.name}/`:", 1)[1].split("; `", 1)[0] if f"`{folder.name}/`:" in row else ""
            modules = [m.name for m in folder.glob("*.py") if m.name != "__init__.py"]
            missing += [f"{folder.name}/{m}" for m in modules if f"`{m}`" not in named]
        assert sorted(missing) == [], package


def test_a_pipeline_run_cuts_its_model_once(make_config, monkeypatch):
    """`build` of a pipeline run cuts the model it trains once (`trainer.step.pipeline.cut.cut_of`): the step's
    runner and eval's forward share that cut. The placement cuts the probe model it builds first, to know where
    each variable goes before the real one is built (`trainer.step.core.spread.build_spread`): two in all."""
    from models import stages
    from trainer.loop.build import build

    cuts = []
    cut = stages.cut
    monkeypatch.setattr(stages, "cut", lambda model, *args: cuts.append(id(model)) or cut(model, *args))
    build(make_config(towers={"num_towers": 2, "pipeline_stages": 2}))
    assert len(cuts) == 2 and len(set(cuts)) == 2  # the probe's, then the trained model's, each once


def test_the_map_names_where_each_decision_is_made_and_those_functions_exist():
    import re

    table = _architecture().split("### Where each decision is made", 1)[1].split("\n\n")[1]
    decisions = [row.split(" | ")[0].lstrip("| ") for row in table.splitlines()[2:]]
    assert [d.split(":")[0].split(",")[0] for d in decisions] == [
        "the settings",
        "the update mode",
        "the task count",
        "the task",
        "how the task's records are read",
        "a built-in task's own arguments and rules (`--lm_width` ...; `--num_classes` with own records)",
        "the data settings",
        "the placement",
        "the tensor split",
        "how a sync step runs its micro-batches",
        "what may change on resume",
    ]
    named = re.findall(r"`((?:trainer|launch|tasks)/[\w/]+)\.py` `(\w+)`", table)
    assert len(named) >= 8
    for path, function in named:  # read, not imported: importing trainer/__main__.py installs its signal handlers
        tree = ast.parse(pathlib.Path(ROOT, f"{path}.py").read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert function in defined, (path, function)
