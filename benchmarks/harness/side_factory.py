"""`make_side`: which class measures a side of a figure. Above `sides` (the image and vector sides), `lm` (the
language model's, built on `sides.TowerflowSide`) and `peers` (the language model's peers, built on `lm`), so none
imports another back."""

from __future__ import annotations

import os

from benchmarks.harness import inputs, lm, reference, sides
from benchmarks.harness.plan import Setting, Side

PEER_KINDS = ("keras_hub_fit", "nanogpt_torch")  # benchmarks/harness/peers.py


def make_side(side: Side, setting: Setting, records: dict, work_dir: str):
    """Builds `side`; `work_dir` is a fresh directory for its model_dir (event files of histogram sides).
    A setting with a task has its own sides (`Setting.task`: the one place that decides it)."""
    if side.kind in PEER_KINDS:
        from benchmarks.harness import peers  # imports Keras Hub and PyTorch on first use: a benchmark-only extra

        return peers.make_side(side, setting, records)
    if setting.task:
        return lm.make_side(side, setting, records, work_dir)
    if side.kind == "towerflow":
        return sides.TowerflowSide(side, setting, records, os.path.join(work_dir, "model"))
    dataset = inputs.memory_dataset(setting, records, setting.global_batch_size)
    if side.kind == "plain":
        return reference.PlainSide(setting, dataset)
    if side.kind == "mirrored":
        return reference.MirroredSide(setting, dataset, side.towers)
    if side.kind == "keras_fit":
        return reference.KerasFitSide(setting, dataset, side.towers, side.steps_per_execution, side.keras_accuracy)
    raise ValueError(f"unknown side kind {side.kind!r}")
