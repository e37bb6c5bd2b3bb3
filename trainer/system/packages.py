"""Towerflow's own top-level packages, and a user's working directory that would take their place.

`python -m trainer` (and `python -m launch.slurm`) puts the working directory first on `sys.path`, so a user's
project decides what `import models` means before towerflow's installed packages do. Two cases:

- A folder without `__init__.py` (a `data/` of records, an empty `models/`) is a namespace portion (PEP 420),
  used only when no regular package of that name is found anywhere on the path. Towerflow's packages are
  regular ones on the path (site-packages, or the repository's top through an editable install's `.pth`
  entry: `setup.cfg`'s `package_dir`), so they win. Should an import hook have left one of them unreachable,
  `claim` loads it from towerflow's own directory, so such a folder is harmless either way.
- A module or regular package of the user's with one of those names (`models.py`, `tasks/__init__.py`) wins
  over everything installed: towerflow would import the user's file as its own package (a traceback somewhere
  deep) and the user's `--model=models:build` would not mean what they wrote. `claim` refuses it in one line
  that names the file and what to do (exit 2).

Imports nothing but the standard library, so it runs before anything else of towerflow's is imported.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

# The top-level packages setup.cfg installs (trainer is the one already running).
PACKAGES = ("data", "models", "tasks", "launch", "benchmarks")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


class ShadowedPackage(ImportError):
    """A module of the user's has the name of one of towerflow's packages; the message says which and what to do."""


def claim(names: tuple[str, ...] = PACKAGES) -> None:
    """Makes `import NAME` give towerflow's package for each of `names`, before any of them is imported.

    Raises:
      ShadowedPackage: a module or regular package of that name stands earlier on `sys.path` (the working
        directory, usually); the message names its file.
    """
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or _is_ours(spec):
            continue
        if spec.origin not in (None, "namespace"):  # a module or a package with __init__.py
            raise ShadowedPackage(_shadow_message(name, spec.origin))
        _load_ours(name)  # a namespace portion found first: a folder of the user's, harmless


def _is_ours(spec) -> bool:
    origin = spec.origin if spec.origin not in (None, "namespace") else None
    return origin is not None and os.path.dirname(os.path.dirname(os.path.realpath(origin))) == ROOT


def _load_ours(name: str) -> None:
    spec = importlib.machinery.PathFinder.find_spec(name, [ROOT])
    if spec is None or spec.loader is None:
        return  # not installed beside trainer/ (a partial install): leave the import system to say so
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def _shadow_message(name: str, origin: str) -> str:
    is_package = os.path.basename(origin) == "__init__.py"
    path = os.path.dirname(origin) + os.sep if is_package else origin
    new = f"my_{name}" if is_package else f"my_{name}.py"
    return (
        f"{path} has the name of towerflow's package '{name}' and would be imported in its place (the working "
        f"directory comes first on Python's import path); rename it, for example to {new}, and name that in "
        "--task or --model"
    )
