"""The serving export: `model_dir/export/<global_step>/`, a SavedModel whose signatures state their input.

TF Serving's layout (one numbered directory per version under `--model_base_path=model_dir/export`). What the
signatures are is the task's (a `Serving`: `trainer.outputs.serving_labeled` for labeled images and vectors,
`TaskServing` for a task's own `serving`); `assets.extra/towerflow_serving.json` records the same contract as
data.

An existing `export/<step>/` is never overwritten (a rerun of a finished run keeps it); a new version is
written into a hidden sibling and renamed into place, so a kill mid-export leaves no numbered directory.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Protocol

import keras
import tensorflow as tf

from data.phase import Phase
from models import vocab_shards
from tasks import TaskError
from trainer.settings.config import RunConfig

SERVING_FILE = os.path.join("assets.extra", "towerflow_serving.json")
_PARTIAL_PREFIX = ".partial-"  # TF Serving only loads all-digit directory names


class Serving(Protocol):
    """What a run exports: its signatures, and their contract as data."""

    def archive(self, model: keras.Model) -> keras.export.ExportArchive:
        """An ExportArchive tracking `model`, one endpoint per signature (the first also serving_default)."""

    def check(self, model: keras.Model) -> None:
        """Raises before training when there is nothing to export."""

    def signature_names(self) -> list[str]: ...

    def contract(self, config: RunConfig, step: int) -> dict:
        """What `assets.extra/towerflow_serving.json` says."""


class TaskServing:
    """A task's own signatures (`tasks.Task.serving`) and `describe()`, for the tasks that read their own
    records."""

    def __init__(self, task):
        self.task = task
        self._names: list[str] = []

    def check(self, model: keras.Model) -> None:
        """Raises `tasks.TaskError` when the task has no signature to export (asked before training, not after)."""
        if not self.task.serving(vocab_shards.served(self.task, model)):
            raise TaskError(
                f"task {self.task.name!r}: serving() returns no signature, so there is nothing to export; define "
                "serving(model) or pass --noexport"
            )

    def archive(self, model: keras.Model) -> keras.export.ExportArchive:
        archive = keras.export.ExportArchive()
        archive.track(model)
        endpoints = self.task.serving(vocab_shards.served(self.task, model))
        for name, (function, specs) in endpoints.items():
            owner = getattr(function, "__self__", None)
            if isinstance(owner, tf.Module):  # its resources (a tokenizer, a lookup table) are saved with it
                archive.track(owner)
            archive.add_endpoint(name, function, list(specs))
        self._names = list(endpoints)
        return archive

    def signature_names(self) -> list[str]:
        return ["serving_default", *self._names] if "serving_default" not in self._names else self._names

    def contract(self, config: RunConfig, step: int) -> dict:
        return {"task": self.task.name, "global_step": step, "signatures": self._names, **self.task.describe()}


def export_saved_model(model: keras.Model, config: RunConfig, serving: Serving, step: int, log) -> str | None:
    """Writes `model` to `config.loop.model_dir/export/<step>/` unless that version exists.

    Args:
      model: the trained logits model (its variables may live on several devices).
      config: the run (model name, mixed precision, model_dir).
      serving: the signatures and their contract.
      step: the global step, the version directory's name.
      log: `log(line)` for one line saying what happened.

    Returns:
      The version directory written, or None when it existed already (kept as it was).
    """
    base = os.path.join(config.loop.model_dir, "export")
    target = os.path.join(base, str(step))
    if os.path.exists(target):
        log(f"export/{step} exists; kept")
        return None
    os.makedirs(base, exist_ok=True)
    _remove_partial(base, log)  # left by a killed export; the run lock says no one else is writing
    partial = os.path.join(base, f"{_PARTIAL_PREFIX}{step}-{os.getpid()}")
    try:
        with Phase(f"exporting to export/{step}", detail="writing the SavedModel"):  # one long call: a clock
            serving.archive(model).write_out(partial, verbose=False)
        _write_contract(partial, serving.contract(config, step))
        os.rename(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    log(f"exported to export/{step} (signatures: {', '.join(serving.signature_names())})")
    if os.path.exists(os.path.join(base, "saved_model.pb")):
        log("export/saved_model.pb is an export of the old layout (before export/<step>/); TF Serving ignores it")
    return target


def _remove_partial(base: str, log) -> None:
    for name in sorted(os.listdir(base)):
        if name.startswith(_PARTIAL_PREFIX):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
            log(f"export: removed {name}, an export that did not finish")


def _write_contract(export_dir: str, contract_: dict) -> None:
    path = os.path.join(export_dir, SERVING_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(contract_, f, indent=2)
        f.write("\n")
