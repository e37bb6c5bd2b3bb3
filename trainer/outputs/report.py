"""What a run leaves for people and tools: `metrics.json` (its contents too), `flags.txt`, and the weights hash."""

from __future__ import annotations

import hashlib
import json
import math
import os

import numpy as np

from models import vocab_shards
from trainer.outputs.costs import cost_warnings
from trainer.step.core import spread
from trainer.system import files, runtime, versions


def weights_sha256(variables) -> str:
    """SHA-256 over the bytes of every variable, in the order given.

    The trainer passes `model.variables`: Keras's tracking order (layers in model order, each layer's
    variables in creation order, non-trainable state such as BatchNorm moving statistics included). Each
    variable contributes its value as a C-ordered numpy array's raw bytes, nothing else (no names, so renamed
    layers hash the same).
    """
    digest = hashlib.sha256()
    for variable in variables:
        digest.update(np.ascontiguousarray(np.asarray(variable.numpy())).tobytes())
    return digest.hexdigest()


def finished_metrics(model_dir: str, train_steps: int, step: int, model, log) -> dict | None:
    """The metrics of a run that a previous start finished (its checkpoint at `train_steps`, restored in
    `model`, and its metrics.json of that step and of these weights), or None: a rerun then neither retrains,
    re-evaluates nor re-exports. A damaged metrics.json (unreadable, or of other weights) is not trusted: the
    run is evaluated again and the file rewritten; `log` says so."""
    path = os.path.join(model_dir, "metrics.json")
    if step < train_steps or not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            metrics = json.loads(f.read().decode("utf-8"))
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        log(f"{path} is unreadable ({type(e).__name__}: {e}); evaluating the finished run again")
        return None
    if not isinstance(metrics, dict) or metrics.get("global_step") != step:
        return None
    if metrics.get("weights_sha256") != weights_sha256(model.variables):
        log(f"{path} does not hold the weights of the checkpoint at step {step}; evaluating it again")
        return None
    return metrics


def write_json(path: str, values) -> None:
    """Writes `values` as strict, indented JSON (NaN and infinities become null), atomically (a reader never
    sees a half-written file)."""
    text = json.dumps(_strict(values), indent=2, sort_keys=True, default=_plain, allow_nan=False)
    files.write_atomically(path, text + "\n")


def write_text(path: str, text: str) -> None:
    """Writes `text` to `path` atomically."""
    files.write_atomically(path, text)


def _strict(value):
    """`value` with every non-finite float replaced by None: JSON has no NaN, and strict parsers refuse it."""
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def final_metrics(state, results: dict, examples_per_sec: float | None, attempts: list) -> dict:
    """metrics.json: the loop's final `results`, what was trained on what (towers, placement, data settings,
    versions, runtime) and the weights hash, from `state` (a `trainer.loop.build.Trainer`). `examples_per_sec` and
    `attempts` cover every attempt of the run (`trainer.outputs.attempts.AttemptLog`)."""
    config = state.config
    t = config.towers
    metrics = {
        "global_step": results["global_step"],
        "train_loss": results.get("train_loss"),
        **{f"train_{name}": results.get(f"train_{name}") for name in state.task.metric_names},
        "eval_loss": results.get("eval_loss"),
        **{f"eval_{name}": results.get(f"eval_{name}") for name in state.task.metric_names},
        **{k: v for k, v in results.items() if k.startswith("eval_")},  # and what the task's eval_metrics adds
        "eval_examples": results.get("eval_examples"),
        "examples_per_sec": examples_per_sec,  # over every attempt of the run
        "bad_records": state.bad_records.count if state.bad_records else 0,
        "attempts": attempts,
        "num_towers": t.total_towers,
        "num_tasks": t.num_tasks,
        "towers_per_task": t.num_towers,
        "micro_batches": t.num_micro_batches,
        "global_batch_size": t.global_batch_size,
        "update_mode": t.update_mode,
        "deterministic": config.deterministic,
        "task": state.task.name,
        "model": state.task.model_description(state.model),
        **state.data_settings.metrics(),  # what it trained on: augment, normalize, cache
        "placement": t.parameter_device,
        "parameter_devices": spread.parameter_devices([*state.model.variables, *state.optimizer.variables]),
        "weights_sha256": weights_sha256(state.model.variables),
        "weights_order": "model.variables (Keras tracking order), raw C-order bytes of each",
        "devices": state.placement.device_roles(t.pipeline.stages, t.tensor.shards),
        "tensor_parallel": _tensor_parallel(t.tensor, state.model),
        "versions": versions.describe(),
        "runtime": runtime.describe(),  # as TensorFlow reports it, not as the flags asked
        "cost_warnings": cost_warnings(config),  # settings measured slower on these devices; [] for none
    }
    metrics.update(state.plan.mode.run_metrics(config, state.updater))  # async: staleness
    return metrics


def _tensor_parallel(split, model) -> dict:
    """metrics.json's `tensor_parallel`: devices per tower and shards; and `vocab_padding` (vocabulary, padded,
    shards, rows, parameters: `models.vocab_shards.padding`) only where the shards do not divide the vocabulary."""
    padding = vocab_shards.padding(model)
    padded = {"vocab_padding": padding} if padding else {}
    return {"devices_per_tower": split.parallel, "shards": split.shards, **padded}
