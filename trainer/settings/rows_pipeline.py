"""Rows of the flag table (`trainer.settings.table`) for a model cut into pipeline stages over the towers'
devices (`trainer.step.pipeline.runner`; docs/pipelines.md). `TowerConfig.pipeline` reads them as one value."""

from __future__ import annotations

from trainer.settings import config as cfg
from trainer.settings.flag import FREE, Flag, at_least


def pipeline() -> list[Flag]:
    g = "pipeline"
    return [
        Flag(
            "pipeline_stages",
            "towers.pipeline_stages",
            g,
            "S: cut the model into S consecutive stages, each on its own device, for a model too large for one "
            "(docs/pipelines.md). The --num_gpus devices of a task form --num_gpus/S pipelines (data parallel "
            "across them); each micro-batch flows through one. Same weights bitwise as S=1 at fixed K. Sync only.",
            FREE,
            check=at_least(1),
        ),
        Flag(
            "pipeline_schedule",
            "towers.pipeline_schedule",
            g,
            "Order of each stage's forward and backward passes with --pipeline_stages: 1f1b (at most S "
            "micro-batches' activations kept per stage) or gpipe (fill-drain: all K). Same weights bitwise.",
            FREE,
            cfg.PIPELINE_SCHEDULES,
        ),
        Flag(
            "pipeline_cuts",
            "towers.pipeline_cuts",
            g,
            "With --pipeline_stages=S: the S-1 places to cut the model, each the name of the layer (or the "
            "model's own piece) that ends a stage, in order. Empty: cut where the stages' parameter bytes are "
            "most even. A name that is not a place to cut is refused with the list of places. Same weights.",
            FREE,
            parse=lambda values: tuple(values or ()),
        ),
        Flag(
            "pipeline_remat",
            "towers.pipeline_remat",
            g,
            "With --pipeline_stages: a stage keeps only its inputs from a micro-batch's forward pass and runs "
            "the forward again in its backward pass (rematerialisation): less activation memory for one more "
            "forward per stage and micro-batch. Same weights bitwise.",
            FREE,
        ),
    ]
