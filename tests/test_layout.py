"""The floors of the repository (docs/architecture.md), read from every module's imports, at module level or
inside a function (a function-level import is the same dependency, only later):

- inside each package (trainer, data, launch, models, benchmarks), no import circle;
- between packages, no import going up: data and models import nothing from trainer, launch or benchmarks
  (nor from each other), launch nothing from data, models or benchmarks and from trainer only what
  docs/architecture.md allows, trainer nothing from benchmarks; none of them imports tests;
- inside trainer/, a module imports from its own floor or the floors below it, never from above;
- launch/ and `trainer.settings` import no TensorFlow, so bad flags and Slurm's tools fail or run before it;
- inside launch/, its rooms: `launch.submit` may read `launch.job`, and nothing but the tests and the benchmarks
  reads `launch.testslurm` (a user's job never needs the test Slurm); trainer/ reads only `launch.job`;
- the engine knows no task by name: no module under trainer/ names a built-in task in its code (comments and
  docstrings aside); what a task is, it learns through `tasks`' interfaces.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.support.paths import ROOT_PATH as ROOT

TRAINER = ROOT / "trainer"
PACKAGES = ("trainer", "data", "launch", "models", "tasks", "benchmarks")
FLOORS = {"settings": 1, "system": 2, "step": 3, "outputs": 4, "loop": 5, "__main__": 6, "cli": 6}
# Packages each package may not import (its own floor and what is above it).
FORBIDDEN = {
    "trainer": {"benchmarks", "tests"},
    "data": {"trainer", "launch", "benchmarks", "models", "tasks", "tests"},
    "models": {"trainer", "launch", "benchmarks", "data", "tasks", "tests"},
    "tasks": {"trainer", "launch", "benchmarks", "tests"},
    "launch": {"data", "models", "tasks", "benchmarks", "tests"},
    "benchmarks": {"tests"},
}
# launch/ runs before and around the trainer, without TensorFlow: what it may borrow from trainer/.
# launch/submit/slurm.py checks the trainer's flags before submitting, as `python -m trainer` settles them.
LAUNCH_MAY_IMPORT = {"launch/submit/slurm.py": ("trainer.settings", "trainer.step.modes", "trainer.system.packages")}
TENSORFLOW = ("tensorflow", "keras", "tf_keras")
# launch/'s rooms (docs/architecture.md): the rooms of launch/ (and trainer/) each may read. The modules at
# launch/'s top are names kept for commands, each forwarding to one room's module.
LAUNCH_ROOMS = {
    "launch.job": ("launch.job",),
    "launch.submit": ("launch.submit", "launch.job"),
    "launch.testslurm": ("launch.testslurm",),
    "trainer": ("launch.job",),
}
# `python -m NAME` commands kept at launch/'s top (or in trainer/): NAME -> the module it runs. A queued job's
# batch script names `launch.lost` (0.4.0 to 0.7.0) or `trainer.outputs.lost` (before) and runs it on every
# requeue; the others are documented commands.
KEPT_NAMES = {
    "launch.slurm": "launch.submit.slurm",
    "launch.lost": "launch.job.lost",
    "trainer.outputs.lost": "launch.job.lost",
    "launch.node_slurm": "launch.testslurm.node_slurm",
}


def _modules(package: str) -> list[pathlib.Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _dotted(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> list[str]:
    """Every module `path` imports, anywhere in it. `from a import b` imports module `a.b` when there is one
    (importing `a` first is Python's, not a dependency of the code), else a name of module `a`."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names += [_module_or_name(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return names


def _module_or_name(module: str, name: str) -> str:
    inner = ROOT.joinpath(*module.split("."), name)
    return f"{module}.{name}" if inner.with_suffix(".py").is_file() or (inner / "__init__.py").is_file() else module


def _graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (a package's `__init__` is the package's name)."""
    modules = {_dotted(path): path for path in _modules(package)}
    return {name: {n for n in _imports(path) if n in modules and n != name} for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`: each strongly connected set of two modules or more, as one circle through
    them (a -> b -> ... -> a), found by a depth-first walk (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = set(stack[stack.index(node) :])
            del stack[stack.index(node) :]
            on_stack.difference_update(members)
            if len(members) > 1:
                found.append(_path_through(graph, members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _path_through(graph: dict[str, set[str]], members: set[str]) -> list[str]:
    """A circle inside `members` (strongly connected), from its first module back to it, for the message."""
    start = min(members)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way back to `start`
        node = frontier.pop(0)
        for nxt in sorted(graph[node] & members):
            if nxt == start:
                return [*paths[node], start]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                frontier.append(nxt)
    raise AssertionError(f"{members} is not a circle")


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_inside_a_package(package):
    circles = [" -> ".join(circle) for circle in _circles(_graph(package))]
    assert circles == [], f"import circles in {package}/: {circles}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_imports_one_above_it(package):
    upward = []
    for path in _modules(package):
        allowed = LAUNCH_MAY_IMPORT.get(str(path.relative_to(ROOT)), ())
        for name in _imports(path):
            if name.split(".")[0] in FORBIDDEN[package] or (
                package == "launch" and name.split(".")[0] == "trainer" and not name.startswith(allowed or ("-",))
            ):
                upward.append(f"{path.relative_to(ROOT)} imports {name}")
    assert upward == [], f"{package}/ imports from above it: {upward}"


@pytest.mark.parametrize("package", ["launch", "trainer/settings"])
def test_imports_no_tensorflow(package):
    found = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules(package)
        for name in _imports(path)
        if name.split(".")[0] in TENSORFLOW
    ]
    assert found == []


def test_importing_every_launch_module_loads_no_tensorflow():
    """What launch/ borrows from trainer/ may not bring TensorFlow in either: imported for real, in a fresh
    interpreter."""
    names = [_dotted(path) for path in _modules("launch")]
    loaded = f"sorted(m for m in sys.modules if m in {TENSORFLOW!r})"
    code = f"import sys\nfor n in {names!r}: __import__(n)\nprint({loaded})"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == "[]"


def _room(dotted: str) -> str | None:
    return next((room for room in LAUNCH_ROOMS if dotted == room or dotted.startswith(room + ".")), None)


@pytest.mark.parametrize("package", ["launch", "trainer"])
def test_each_room_of_launch_reads_only_the_rooms_it_may(package):
    crossing = []
    for path in _modules(package):
        dotted = _dotted(path)
        own = _room(dotted)
        if own is None:  # launch/__init__.py and the kept names at the top: checked below
            assert dotted in ("launch", *KEPT_NAMES), f"{path.relative_to(ROOT)} is in none of launch/'s rooms"
            continue
        for name in _imports(path):
            if name.split(".")[0] == "launch" and not name.startswith(LAUNCH_ROOMS[own]):
                crossing.append(f"{path.relative_to(ROOT)} imports {name}")
    assert crossing == [], crossing


def test_the_kept_names_only_forward():
    """Each name kept at launch/'s top (or in trainer/) imports the one module it runs and nothing of its own."""
    for name, target in KEPT_NAMES.items():
        path = ROOT.joinpath(*name.split(".")).with_suffix(".py")
        assert sorted(_imports(path)) == sorted(["sys", target]), f"{path.relative_to(ROOT)} imports more than {target}"
        assert "def " not in path.read_text(), f"{path.relative_to(ROOT)} should only forward to {target}"


def test_a_rendered_batch_script_names_only_modules_that_exist():
    from launch.submit import sbatch  # noqa: PLC0415

    spec = sbatch.JobSpec(model_dir="/tmp/m", trainer_args=(), python="python", workdir="/tmp", nodes=2)
    commands = [line for line in sbatch.render(spec).splitlines() if not line.startswith("#")]
    named = {name for line in commands for name in re.findall(r" -m ([\w.]+)", line)}
    assert named == {"trainer", "launch.job.lost"}
    for module in named:
        assert ROOT.joinpath(*module.split(".")).with_suffix(".py").is_file() or (ROOT / module).is_dir()


def _floor(dotted: str) -> int | None:
    parts = dotted.split(".")
    return FLOORS.get(parts[1]) if parts[0] == "trainer" and len(parts) > 1 else None


@pytest.mark.parametrize(
    "path",
    [p for p in _modules("trainer") if p.parent != TRAINER or p.name != "__init__.py"],
    ids=lambda p: str(p.relative_to(TRAINER)),
)
def test_no_trainer_module_imports_from_a_floor_above_its_own(path):
    own = _floor(_dotted(path))
    assert own is not None, f"{path} is on no floor: add its package to FLOORS and docs/architecture.md"
    above = [name for name in _imports(path) if (_floor(name) or 0) > own]
    assert above == []


def test_the_checks_see_an_upward_import_and_a_circle(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from trainer.loop import run\n")
    assert [n for n in _imports(module) if (_floor(n) or 0) > 1] == ["trainer.loop.run"]
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a", "p.d"}, "p.d": set(), "p.e": {"p.d"}}
    assert _circles(graph) == [["p.a", "p.b", "p.c", "p.a"]]
    assert _circles({"p.a": {"p.b"}, "p.b": {"p.d"}, "p.d": set()}) == []


def test_the_old_names_of_the_batch_shells_tool_still_run(tmp_path):
    """A job submitted before `launch.lost` moved out of trainer/ runs `python -m trainer.outputs.lost` on each
    requeue (Slurm keeps the batch script as rendered), and one submitted before `launch.job.lost` moved into
    launch/job/ runs `python -m launch.lost`: both names must still end an empty run's step, saying so, as the
    new one does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for module in ("trainer.outputs.lost", "launch.lost", "launch.job.lost"):
        result = subprocess.run(
            [sys.executable, "-m", module, f"--model_dir={tmp_path}"], capture_output=True, text=True, env=env
        )
        assert (result.returncode, result.stdout) == (0, "=== towerflow: not a Slurm job: nothing to requeue\n")


# The built-in tasks' names, classes and flags (tasks.BUILT_IN, tasks.lm_options), as words of code.
TASK_NAMES = re.compile(r"\b(classify|Classify|lm|LanguageModel)\b|\blm_\w")


def _named_tasks(path: pathlib.Path) -> list[str]:
    """Each name or string of `path`'s code that names a built-in task: identifiers, attribute names, imported
    names and string literals (help texts, messages, f-string parts); docstrings and comments are not code."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    }
    words = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            words.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            words.append((node.lineno, node.attr))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words.append((node.lineno, node.name))
        elif isinstance(node, ast.alias):
            words.append((getattr(node, "lineno", 0), f"{node.name} {node.asname or ''}"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            words.append((node.lineno, node.module))
    return [f"{path.relative_to(ROOT)}:{line}: {text!r}" for line, text in words if TASK_NAMES.search(text)]


def test_no_trainer_module_names_a_built_in_task():
    """A built-in task is a user task that ships with towerflow: its records, serving, arguments and rules are
    found through `tasks` (the `Task` interface, `tasks.options`), never by the engine testing its name."""
    named = [found for path in _modules("trainer") for found in _named_tasks(path)]
    assert named == [], named


def test_the_task_name_check_sees_a_name_in_code_and_not_in_a_docstring_or_comment(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        '"""Docs may say --task=classify and --lm_width."""\n'
        "# so may comments: lm\n"
        "def f(task):\n"
        '    """Nor here: LanguageModel."""\n'
        '    return task.name == "lm" or f"--lm_width {task}" or task.classify\n'
    )
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        found = _named_tasks(module)
    finally:
        ROOT = root
    assert sorted(line.split(": ", 1)[1] for line in found) == ["'--lm_width '", "'classify'", "'lm'"]


def test_the_image_holds_every_package_the_install_names():
    """The Dockerfile copies each package setup.cfg installs (`[options.packages.find] include`) before its
    `pip install .`: an image built without `tasks/` (0.7.0's) installed a trainer that cannot import its tasks.
    The package data comes along with its folder (`data/digits.csv.gz`, the default job's digits)."""
    setup = (ROOT / "setup.cfg").read_text()
    included = re.search(r"^\[options\.packages\.find\]\ninclude =\n((?:    .+\n)+)", setup, re.MULTILINE)
    packages = {line.strip().rstrip("*") for line in included.group(1).splitlines()}
    assert packages == set(PACKAGES)
    copied = set(re.findall(r"^COPY (\w+)/ \1/$", (ROOT / "Dockerfile").read_text(), re.MULTILINE))
    assert copied == packages
    assert re.search(r"^data = digits\.csv\.gz$", setup, re.MULTILINE)
