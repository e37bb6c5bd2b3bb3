"""trainer/'s floors (docs/architecture.md): a module imports from its own floor or the floors below it, never
from above, at module level or inside a function; and `trainer.settings` imports no TensorFlow, so bad flags
fail before it loads."""

import ast
import pathlib

import pytest

TRAINER = pathlib.Path(__file__).resolve().parent.parent / "trainer"
FLOORS = {"settings": 1, "system": 2, "step": 3, "outputs": 4, "loop": 5, "__main__": 6, "cli": 6}


def _modules():
    return sorted(p for p in TRAINER.rglob("*.py") if p.name != "__init__.py" or p.parent != TRAINER)


def _floor(dotted: str) -> int | None:
    parts = dotted.split(".")
    return FLOORS.get(parts[1]) if parts[0] == "trainer" and len(parts) > 1 else None


def _imports(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "trainer"]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def _dotted(path: pathlib.Path) -> str:
    return ".".join(("trainer", *path.relative_to(TRAINER).with_suffix("").parts))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(TRAINER)))
def test_no_module_imports_from_a_floor_above_its_own(path):
    own = _floor(_dotted(path))
    assert own is not None, f"{path} is on no floor: add its package to FLOORS and docs/architecture.md"
    above = [name for name in _imports(path) if (_floor(name) or 0) > own]
    assert above == []


def test_the_settings_floor_imports_no_tensorflow():
    for path in (TRAINER / "settings").glob("*.py"):
        assert not [n for n in _imports(path) if n.split(".")[0] in ("tensorflow", "keras")], path


def test_the_floor_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from trainer.loop import run\n")
    assert [n for n in _imports(module) if (_floor(n) or 0) > 1] == ["trainer.loop"]
