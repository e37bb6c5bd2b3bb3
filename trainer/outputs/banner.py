"""The lines a run prints before its first step and after its last: what is trained where, and where the
outputs are. Plain text, one fact per line, so a log file reads the same as a terminal."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from trainer.outputs.costs import cost_warnings
from trainer.outputs.progress import format_duration
from trainer.settings.config import RunConfig


def start_lines(config: RunConfig, state) -> list[str]:
    """The banner: model, towers, batch, data, what training does to the data (augmentation, normalization and
    cache, with what `auto` chose), optimizer and model_dir (the attempt line says fresh or resumed), then a
    warning for each setting known to be slow on these devices (`trainer.outputs.costs`)."""
    t, o = config.towers, config.optimizer
    placement = state.placement
    params = sum(int(np.prod(v.shape)) for v in state.model.trainable_variables)
    size_mb = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in state.model.variables) / 2**20
    mode = t.update_mode + (", deterministic" if config.deterministic else "")
    towers = ", ".join(placement.describe_tower(i) + f" ({d})" for i, d in enumerate(placement.towers))
    variables = "spread over the towers" if placement.spread_over else f"on {placement.parameter_device}"
    train, evaluation = state.inputs.train, state.inputs.eval
    what, *more = state.reader.banner_lines(state.inputs, state.data_settings)
    return [
        f"task       {state.task.name}",
        f"model      {state.task.model_description(state.model)}: {params:,} trainable parameters, "
        f"{size_mb:.2f} MB of variables "
        f"{variables}; {t.mixed_precision or 'float32'}{', XLA' if t.jit_compile else ''}",
        f"towers     {t.total_towers} ({mode}): {towers}",
        f"batch      {t.global_batch_size} per step = {t.num_micro_batches} micro-batches of {t.micro_batch_size}",
        f"data       train {_files(train.files)}, eval {_files(evaluation.files)}; {what}",
        *more,
        f"optimizer  {o.name}, learning rate {o.learning_rate:g} ({_schedule(config)})",
        f"model_dir  {config.loop.model_dir}, training to step {config.loop.train_steps}",
        *(f"warning: {warning}" for warning in cost_warnings(config)),
    ]


def end_lines(config: RunConfig, metrics: dict, seconds: float, export_dir: str | None) -> list[str]:
    """The closing summary: steps, wall time, final eval, and where every output is."""
    model_dir = config.loop.model_dir
    done = f"done: step {metrics['global_step']} in {format_duration(seconds)}"
    if metrics.get("examples_per_sec"):
        done += f" ({metrics['examples_per_sec']:,.0f} examples/s over the run)"
    if metrics.get("eval_loss") is not None:
        figures = [f"{k[len('eval_') :]} {v:.4f}" for k, v in metrics.items() if _eval_figure(k, v)]
        done += f"; eval {', '.join(figures)} ({metrics['eval_examples']} examples)"
    outputs = f"outputs: {os.path.join(model_dir, 'metrics.json')}"
    if export_dir:
        outputs += f", SavedModel {export_dir}"
    return [done, outputs + f"; TensorBoard: tensorboard --logdir={model_dir}"]


def _eval_figure(key: str, value) -> bool:
    return key.startswith("eval_") and key != "eval_examples" and isinstance(value, float)


def _files(files) -> str:
    if len(files) == 1:
        return files[0]
    return f"{len(files)} files ({os.path.commonpath(files)}/...)"


def _shape(shape) -> str:
    return "x".join(str(d) for d in shape)


def _schedule(config: RunConfig) -> str:
    o = config.optimizer
    warmup = f", {o.warmup_steps} warmup steps" if o.warmup_steps else ""
    if o.schedule == "cosine":
        return f"cosine to {o.min_learning_rate:g} at step {config.loop.train_steps}{warmup}"
    if o.schedule == "piecewise":
        return f"piecewise: {list(o.values)} at {list(o.boundaries)}"
    return f"constant{warmup}"
