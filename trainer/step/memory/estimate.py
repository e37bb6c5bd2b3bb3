"""Whether a step can fit in memory, estimated from the model before the first step runs.

A batch far too large used to fail at its first step, after the input pipeline and the graph were built (27 s
on the digits with --global_batch_size=10000000), with a traceback that did not say memory: TensorFlow
refused to build a >2 GB constant (InvalidArgumentError), or ran out of memory (ResourceExhaustedError).

The estimate is a lower bound, so it never refuses a batch that fits: the forward activations a step must
keep for its backward pass (every layer's output, counted from the built model, times the examples computed
at once) plus the weights, their gradients and two optimizer slots, plus the global batch itself as float32.
On CPU towers all of this shares the host's memory (MemAvailable, or the cgroup's limit); on GPUs it is per
device and only checked against --gpu_memory_limit_mb (TensorFlow does not say a GPU's size before it
allocates).

With pipeline stages (`--pipeline_stages=S`) the bound counts pipelines, not towers: each pipeline keeps at
least one micro-batch's activations of the whole model (its first micro-batch's, across the stages, until
its backward starts), and on GPUs a device holds one stage, so the fullest device needs at least 1/S of what
its pipeline needs (the mean over its S devices).
"""

from __future__ import annotations

import math

from trainer.settings.config import ConfigError, RunConfig

GB = 1 << 30


def check_batch_fits(model, config: RunConfig, example_shape: tuple[int, ...]) -> None:
    """Raises ConfigError when a step of `config` needs more memory than there is, with both numbers."""
    t = config.towers
    per_micro_batch = t.global_batch_size // t.num_micro_batches
    concurrent = per_micro_batch * (t.num_towers // t.pipeline.stages if t.device == "cpu" else 1)
    activations = activation_bytes_per_example(model)
    weights = 4 * sum(math.prod(v.shape) * _dtype_size(v.dtype) for v in model.variables)  # + grads, 2 slots
    batch = t.global_batch_size * math.prod(example_shape) * 4 if t.device == "cpu" else 0
    per_device = 1 if t.device == "cpu" else t.pipeline.stages  # a GPU holds one stage (module docstring)
    needed = -(-(activations * concurrent + weights) // per_device) + batch
    available = available_bytes(config)
    if available is None or needed <= available:
        return
    raise ConfigError(
        f"--global_batch_size={t.global_batch_size} does not fit: a step needs at least ~{needed / GB:.1f} GB "
        f"({activations / 1024:.0f} KB of activations per example x {concurrent} examples computed at once, plus "
        f"weights, gradients, optimizer slots and the batch), {available / GB:.1f} GB available; lower "
        f"--global_batch_size or raise --micro_batches"
    )


def activation_bytes_per_example(model) -> int:
    """Bytes of every layer's output for one example (nested models' layers counted, not the models)."""
    total = 0
    for layer in _layers(model):
        try:
            outputs = layer.output
        except (AttributeError, ValueError):  # a layer called more than once, or never: not counted
            continue
        for out in outputs if isinstance(outputs, (list, tuple)) else [outputs]:
            dims = tuple(out.shape)[1:]
            if dims and all(d is not None for d in dims):
                total += math.prod(dims) * _dtype_size(out.dtype)
    return total


def available_bytes(config: RunConfig) -> int | None:
    """Memory a step may use: the GPU limit given, or the host's available memory; None: unknown."""
    if config.towers.device == "gpu":
        limit = config.runtime.gpu_memory_limit_mb
        return limit * (1 << 20) if limit else None
    sizes = [_meminfo("MemAvailable"), _cgroup_limit()]
    sizes = [s for s in sizes if s]
    return min(sizes) if sizes else None


def _layers(model):
    for layer in getattr(model, "layers", []):
        if getattr(layer, "layers", None):
            yield from _layers(layer)
        else:
            yield layer


def _dtype_size(dtype) -> int:
    name = str(getattr(dtype, "name", dtype))
    return 2 if "16" in name else 8 if "64" in name else 4


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(f"{key}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cgroup_limit() -> int | None:
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit
