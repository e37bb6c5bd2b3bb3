"""Rows of the flag table (`trainer.settings.table`) for a model cut into pipeline stages over the towers'
devices (`trainer.step.pipeline.runner`; docs/pipelines.md). `TowerConfig.pipeline` reads them as one value."""

from __future__ import annotations

from trainer.settings import config as cfg
from trainer.settings import splits
from trainer.settings.flag import FIXED, FREE, Flag, at_least


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


def tensor() -> list[Flag]:
    g = "pipeline"
    return [
        Flag(
            "tensor_parallel",
            "towers.tensor_parallel",
            g,
            "T: a tower is T devices, and each wide layer of the model is split over them (tensor parallelism, "
            "docs/tensor_parallel.md: attention by heads, the MLP by columns then rows, embedding and head by "
            "vocabulary). --num_gpus = data x stages x T on each task. Same weights bitwise for every T dividing "
            "--tensor_shards. Sync only; a model with split layers (the built-in language model's, or by "
            "--tensor_layout).",
            FREE,
            check=at_least(1),
        ),
        Flag(
            "tensor_shards",
            "towers.tensor_shards",
            g,
            "N: the shards each split layer is cut into, a property of the model (its variables, its checkpoints): "
            "fix it to get the same bits at every --tensor_parallel dividing it, as --micro_batches fixes the "
            "batch's split. 0: --tensor_parallel.",
            FIXED,
            check=at_least(0),
        ),
        Flag(
            "tensor_layout",
            "towers.tensor_layout",
            g,
            "Which layers of the model split, as PATTERN=column, PATTERN=row or PATTERN=heads (comma-separated; "
            "a pattern is a regular expression matching a layer's whole path, e.g. dense1 or "
            "transformer_layer_0/self_attention): a Dense layer by output columns or input rows, a "
            "MultiHeadAttention by heads; a row layer right after a column layer takes its shards' outputs where "
            "they are. Without it, a model holding Keras Hub GPT-2 or Llama blocks splits by a built-in plan "
            "(docs/tensor_parallel.md). Part of the model, as --tensor_shards.",
            FIXED,
            parse=layout_entries,
        ),
    ]


def layout_entries(values) -> tuple[str, ...]:
    """--tensor_layout's entries as given, once each parses (`splits.layout_pairs`)."""
    splits.layout_pairs(values or ())
    return tuple(values or ())
