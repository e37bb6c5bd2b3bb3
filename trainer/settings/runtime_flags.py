"""The `runtime` flag group of `python -m trainer`: how TensorFlow runs (threads, GPU memory, oneDNN, cuDNN
autotuning, Grappler passes), not what is trained. Applied by `trainer.system.runtime`; no TensorFlow import here,
so bad values fail before it loads.
"""

from __future__ import annotations

from absl import flags

from trainer.settings import config as cfg


def define() -> None:
    """Defines the runtime flags on absl's global FLAGS (`trainer.settings.flags` groups them under `runtime`)."""
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


def config_from(f) -> cfg.RuntimeConfig:
    """The runtime flags of parsed `f` as a `RuntimeConfig` (validated with the rest of the config)."""
    return cfg.RuntimeConfig(
        f.onednn,
        f.inter_op_threads,
        f.intra_op_threads,
        f.gpu_memory_growth,
        f.gpu_memory_limit_mb,
        f.cudnn_autotune,
        f.grappler,
    )
