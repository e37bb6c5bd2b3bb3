"""The software a run used, for `flags.txt` (as `#` comments, which `--flagfile` skips) and `metrics.json`.

Versions come from the imported module where there is one, else from the installed distribution's metadata,
so this works before TensorFlow is imported (and without importing it, which takes seconds).
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys

# key -> (module, distributions that may provide it, first found wins)
SOURCES = {
    "towerflow": (None, ("towerflow",)),
    "tensorflow": ("tensorflow", ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly")),
    "keras": ("keras", ("keras", "keras-nightly")),
    "python": (None, ()),
    "numpy": ("numpy", ("numpy",)),
}


def describe() -> dict[str, str]:
    """{towerflow, tensorflow, keras, python, numpy} -> version; 'unknown' where none is found."""
    found = {key: _version(module, dists) for key, (module, dists) in SOURCES.items()}
    found["python"] = platform.python_version()
    return found


def _version(module: str | None, dists: tuple[str, ...]) -> str:
    loaded = sys.modules.get(module) if module else None
    if getattr(loaded, "__version__", None):
        return str(loaded.__version__)
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def flagfile_header(devices: str, versions: dict[str, str] | None = None) -> str:
    """Comment lines for the top of flags.txt: the versions and the devices of this start."""
    versions = versions or describe()
    lines = [f"# {key} {value}" for key, value in versions.items()]
    return "\n".join([*lines, f"# devices: {devices}"]) + "\n"


def devices_summary(towers) -> str:
    """The towers a `TowerConfig` asks for, e.g. `2 cpu towers (logical CPU devices) x 1 task, parameters on
    gpu`; metrics.json lists the device strings themselves."""
    kind = "logical CPU devices" if towers.device == "cpu" else "GPUs"
    tasks = f"{towers.num_tasks} task{'s' if towers.num_tasks != 1 else ''}"
    return (
        f"{towers.num_towers} {towers.device} tower(s) ({kind}) per task x {tasks}, "
        f"parameter_device={towers.parameter_device}"
    )
