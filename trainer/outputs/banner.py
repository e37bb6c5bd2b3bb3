"""The lines a run prints before its first step and after its last: what is trained where, and where the
outputs are. Plain text, one fact per line, so a log file reads the same as a terminal."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from models import sharded, vocab_shards
from trainer.outputs.costs import cost_warnings
from trainer.outputs.progress import format_duration
from trainer.settings.config import RunConfig
from trainer.step.pipeline.runner import PipelineRunner


def start_lines(config: RunConfig, state) -> list[str]:
    """The banner: model, towers (or pipelines and their stages), batch, data, what training does to the data
    (augmentation, normalization and cache, with what `auto` chose), optimizer and model_dir (the attempt line
    says fresh or resumed), then a warning for each setting known to be slow on these devices
    (`trainer.outputs.costs`). Where things run and where the variables live is read off the objects that
    decided it: the placement, the step's runner (its stages) and its mirrors."""
    t, o = config.towers, config.optimizer
    staged = _pipeline_runner(state.updater)
    params = sum(int(np.prod(v.shape)) for v in state.model.trainable_variables)
    mode = t.update_mode + (", deterministic" if config.deterministic else "")
    train, evaluation = state.inputs.train, state.inputs.eval
    what, *more = state.reader.banner_lines(state.inputs, state.data_settings)
    return [
        f"task       {state.task.name}",
        f"model      {state.task.model_description(state.model)}: {params:,} trainable parameters, "
        f"{_mb(state.model.variables)} MB of variables "
        f"{_variables_where(state, staged)}; {t.mixed_precision or 'float32'}{', XLA' if t.jit_compile else ''}",
        *(_pipeline_lines(staged, state.placement, mode) if staged else _tower_lines(state.placement, mode, t.tensor)),
        *_tensor_lines(state.model, t.tensor, state.task),
        f"batch      {t.global_batch_size} per step = {_micro_batches(t.num_micro_batches)} of {t.micro_batch_size}",
        f"data       train {_files(train.files)}, eval {_files(evaluation.files)}; {what}",
        *more,
        f"optimizer  {o.name}, learning rate {o.learning_rate:g} ({_schedule(config)})",
        f"model_dir  {config.loop.model_dir}, training to step {config.loop.train_steps}",
        *(f"warning: {warning}" for warning in cost_warnings(config)),
    ]


def _pipeline_runner(updater) -> PipelineRunner | None:
    """The step's pipeline runner, or None when each micro-batch runs whole on a tower (or the mode has none)."""
    runner = getattr(updater, "runner", None)
    return runner if isinstance(runner, PipelineRunner) else None


def _variables_where(state, staged: PipelineRunner | None) -> str:
    """Where the model's variables live: each stage's on its device, spread over the towers (with those kept on
    every task, `trainer.step.transfers.mirrors`), or all on the parameter device."""
    placement = state.placement
    split = "; each shard's on its device" if state.config.towers.tensor.parallel > 1 else ""
    if staged is not None:
        return "on each stage's device" + (" of pipeline 0" if staged.num_pipelines > 1 else "") + split
    if split:
        return f"on {placement.towers[0]}{split} of tower 0"
    if not placement.spread_over:
        return f"on {placement.parameter_device}"
    mirrors = getattr(state.updater, "mirrors", None)
    mirrored = len(mirrors.indices) if mirrors is not None else 0
    also = f", {mirrored} of them with a copy on every task" if mirrored else ""
    return f"spread over the {len(placement.spread_over)} towers{also}"


def _tower_lines(placement, mode: str, split=None) -> list[str]:
    """`towers N (mode): tower 0 (device), ...`; with --tensor_parallel, each tower's devices."""
    if split is None or split.parallel == 1:
        towers = ", ".join(placement.describe_tower(i) + f" ({d})" for i, d in enumerate(placement.towers))
        return [f"towers     {len(placement.towers)} ({mode}): {towers}"]
    towers = ", ".join(
        placement.describe_tower(i) + f" ({' + '.join(placement.group(i))})" for i in range(len(placement.towers))
    )
    return [f"towers     {len(placement.towers)} of {split.parallel} devices ({mode}): {towers}"]


def _tensor_lines(model, split, task=None) -> list[str]:
    """`tensor     N shards per split layer, where: the split layers`, whenever the model is kept as shards (at
    T = 1 too, where one device runs them all), or `--tensor_layout` was given; then the vocabulary's padding,
    if the shards do not divide it, and the gather of a split head's logits for a task that does not take
    vocabulary shards (`models.vocab_shards`)."""
    if split.shards == 1:
        return ["tensor     --tensor_layout splits nothing at --tensor_shards=1"] if split.layout else []
    if split.parallel == 1:
        where = "all on each tower's one device (--tensor_parallel=1)"
    else:
        where = f"{split.shards // split.parallel} per device"
    named = [f"{name} ({how})" for name, how in sharded.split_layers(model)]
    if len(named) > 6:  # a Transformer's: its first and last, and how many
        named = [*named[:2], "...", named[-1], f"{len(named)} layers in all"]
    padding = vocab_shards.padding(model)  # a vocabulary the shards do not divide: what padding it costs
    padded = [f"tensor     {vocab_shards.describe_padding(padding)}"] if padding else []
    vocab = vocab_shards.gathered_for(task, model)
    gathered = [
        f"tensor     the head's {vocab} logits per position gathered on shard 0's device for the task's loss, "
        "metrics and serving (it does not set vocabulary_shards: docs/tensor_parallel.md)"
    ]
    gathered = gathered if vocab is not None else []
    return [f"tensor     {split.shards} shards per split layer, {where}: {', '.join(named)}", *padded, *gathered]


def _micro_batches(k: int) -> str:
    return "1 micro-batch" if k == 1 else f"{k} micro-batches"


def _pipeline_lines(runner: PipelineRunner, placement, mode: str) -> list[str]:
    """`pipelines P of S stages (...)`: each pipeline's devices in stage order; then a line per stage: its
    layers, and its variables' size and device (the stage's device of pipeline 0, which the others read)."""
    how = f"{mode}; {runner.schedule} schedule"
    if runner.remat:
        again = runner.recomputing_stages
        which = f"stage {again[0]} recomputes" if len(again) == 1 else f"stages {', '.join(map(str, again))} recompute"
        how += f", remat: {which}" if again else ", remat: no stage recomputes"
    pipes = []
    for p in range(runner.num_pipelines):
        first = p * runner.num_stages
        devices = [
            placement.describe_tower(first + s) + f" ({' + '.join(placement.group(first + s))})"
            for s in range(runner.num_stages)
        ]
        pipes.append(f"pipeline {p} " + " -> ".join(devices))
    head = f"pipelines  {runner.num_pipelines} of {runner.num_stages} stages ({how}): {', '.join(pipes)}"
    return [head, *(_stage_line(runner, s) for s in range(runner.num_stages))]


def _stage_line(runner: PipelineRunner, stage: int) -> str:
    names = [layer.name for layer in runner.stages[stage].layers]
    layers = f"layer {names[0]}" if len(names) == 1 else f"layers {names[0]}..{names[-1]} ({len(names)} layers)"
    variables = runner.stage_variables(stage)
    return f"{f'stage {stage}':<10} {layers}, {_mb(variables)} MB of variables on {runner.device(0, stage)}"


def _mb(variables) -> str:
    return f"{sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables) / 2**20:.2f}"


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
