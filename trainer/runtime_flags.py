"""The runtime group of `python -m trainer`'s flags (threads, GPU memory, oneDNN, cuDNN autotuning, graph
rewrites) and their conversion into a `RuntimeConfig`.

Apart from `trainer.flags` so that module stays small; its `_groups()` still lists this group, so `--help`
and flags.txt treat these flags like every other.
"""

from __future__ import annotations

from absl import flags

from trainer import config as cfg


def define_runtime_flags() -> None:
    """Defines the runtime group's flags on absl's global FLAGS (called by `trainer.flags.define_flags`,
    which records them under the `runtime` heading of `--help`)."""
    flags.DEFINE_enum(
        "onednn",
        "auto",
        list(cfg.SWITCHES),
        "CPU: oneDNN kernels (TF_ENABLE_ONEDNN_OPTS, set before TensorFlow loads). auto: TensorFlow's default "
        "(on for x86 builds). Their different rounding changes the loss in the last digits, not the training.",
    )
    flags.DEFINE_integer("inter_op_threads", 0, "Threads running independent ops in parallel; 0: TensorFlow's default.")
    flags.DEFINE_integer("intra_op_threads", 0, "Threads inside one op (matmul, conv); 0: TensorFlow's default.")
    flags.DEFINE_bool(
        "gpu_memory_growth", False, "Allocate GPU memory as needed instead of all at start (shared GPUs). GPU only."
    )
    flags.DEFINE_integer(
        "gpu_memory_limit_mb", 0, "Cap each GPU at this many MiB (not with --gpu_memory_growth); 0: none. GPU only."
    )
    flags.DEFINE_enum(
        "cudnn_autotune",
        "auto",
        list(cfg.SWITCHES),
        "Time cuDNN's algorithms and keep the fastest (TF_CUDNN_USE_AUTOTUNE). auto: off under --deterministic "
        "(op determinism already forces deterministic algorithms; on is refused there), else TensorFlow's default.",
    )
    flags.DEFINE_string(
        "grappler",
        "",
        "Graph-rewrite passes NAME=on|off,..., e.g. layout_optimizer=off,remapping=off "
        "(tf.config.optimizer.set_experimental_options); empty: TensorFlow's defaults.",
    )


def runtime_config(f) -> cfg.RuntimeConfig:
    """The `RuntimeConfig` of parsed flags (validated with the rest of the `RunConfig`)."""
    return cfg.RuntimeConfig(
        f.onednn,
        f.inter_op_threads,
        f.intra_op_threads,
        f.gpu_memory_growth,
        f.gpu_memory_limit_mb,
        f.cudnn_autotune,
        f.grappler,
    )
