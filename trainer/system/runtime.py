"""Runtime options (`--onednn`, `--*_op_threads`, `--gpu_memory_*`, `--cudnn_autotune`, `--grappler`): how
TensorFlow runs, not what is trained.

Each one has a moment after which TensorFlow ignores or refuses it: `environment` gives the variables read
when TensorFlow is imported (`python -m trainer` sets them before its import); `apply` makes the tf.config
calls that must come before TensorFlow initialises its devices (`trainer.loop.build.build`, before
`devices.place`), and `apply_grappler` the graph-rewrite switches (after `determinism.configure`, which sets
one of them). A setting already at its requested value is left alone, so a process whose devices are already
up (tests, a second `train` call) runs; a change that has become impossible raises `ConfigError`.
`describe` reads every setting back from TensorFlow for metrics.json.
"""

from __future__ import annotations

import contextlib
import os
import sys

from trainer.settings.config import ConfigError, RuntimeConfig, grappler_options

ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
AUTOTUNE_ENV = "TF_CUDNN_USE_AUTOTUNE"
_ENV_VALUES = {"on": "1", "off": "0"}


def environment(config: RuntimeConfig, deterministic: bool) -> dict[str, str]:
    """The environment variables to set before TensorFlow is imported; "auto" sets none (TensorFlow's
    default), except cuDNN autotuning, which is off under `deterministic` (op determinism already picks
    deterministic algorithms; timing them would only cost start-up time). Imports no TensorFlow."""
    env = {}
    if config.onednn != "auto":
        env[ONEDNN_ENV] = _ENV_VALUES[config.onednn]
    autotune = "off" if config.cudnn_autotune == "auto" and deterministic else config.cudnn_autotune
    if autotune != "auto":
        env[AUTOTUNE_ENV] = _ENV_VALUES[autotune]
    return env


# Packages that TensorFlow's and Keras's own imports load when they are installed, each inside `try: ...
# except ImportError`, for what a training process never uses: IPython for Keras's notebook display
# (keras.src.saving.file_editor), scipy.sparse for the legacy tf.keras's sparse inputs, scikit-learn for Keras's
# scikit-learn wrappers. Most research environments have them: 1.0 CPU-s of the 3.8 that `import tensorflow,
# keras` takes with IPython and SciPy installed (1.4 with scikit-learn too), at every start of every task.
OPTIONAL_PACKAGES = ("IPython", "scipy", "sklearn")


@contextlib.contextmanager
def without_optional_packages():
    """Within the block, `import` of an OPTIONAL_PACKAGES package not yet imported raises ImportError (TensorFlow
    and Keras then go on without the feature); after it, each imports as usual (a user's task may use SciPy)."""
    hidden = [name for name in OPTIONAL_PACKAGES if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # the import system's "not available" mark
    try:
        yield
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def apply(config: RuntimeConfig, deterministic: bool) -> None:
    """Applies the settings that must precede device initialisation: thread pools, GPU memory; and cuDNN
    autotuning, which TensorFlow reads at its first cuDNN call.

    Raises:
      ConfigError: --onednn differs from what TensorFlow was imported with, or a setting can no longer change
        (TensorFlow's devices are already initialised).
    """
    import tensorflow as tf  # noqa: PLC0415 (the module's environment part must not import it)

    wanted = environment(config, deterministic)
    if ONEDNN_ENV in wanted and os.environ.get(ONEDNN_ENV) != wanted[ONEDNN_ENV]:
        raise ConfigError(
            f"--onednn={config.onednn} must be set before TensorFlow is imported (python -m trainer does): "
            f"set {ONEDNN_ENV}={wanted[ONEDNN_ENV]} in the environment of this process"
        )
    if AUTOTUNE_ENV in wanted:
        os.environ[AUTOTUNE_ENV] = wanted[AUTOTUNE_ENV]
    threading = tf.config.threading
    _set("inter_op_threads", config.inter_op_threads, threading.set_inter_op_parallelism_threads)
    _set("intra_op_threads", config.intra_op_threads, threading.set_intra_op_parallelism_threads)
    for gpu in tf.config.list_physical_devices("GPU"):
        if config.gpu_memory_growth:
            _set("gpu_memory_growth", True, lambda on, g=gpu: tf.config.experimental.set_memory_growth(g, on))
        if config.gpu_memory_limit_mb:
            _set("gpu_memory_limit_mb", config.gpu_memory_limit_mb, lambda mb, g=gpu: _limit_memory(tf, g, mb))


def _limit_memory(tf, gpu, megabytes: int) -> None:
    current = tf.config.get_logical_device_configuration(gpu) or []
    if [c.memory_limit for c in current] == [megabytes]:
        return
    tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=megabytes)])


def _set(flag: str, value, setter) -> None:
    """Calls `setter(value)` unless `value` is 0/False (TensorFlow's default, left alone); TensorFlow's setters
    return at once when the value is already in force, and raise RuntimeError when it can no longer change."""
    if not value:
        return
    try:
        setter(value)
    except (RuntimeError, ValueError) as e:
        raise ConfigError(
            f"--{flag}={value} cannot be applied: TensorFlow's devices are already initialised ({e}); "
            "set it before the first TensorFlow op (python -m trainer does)"
        ) from e


def apply_grappler(config: RuntimeConfig) -> None:
    """Sets the --grappler switches. They are process-wide and stay set for later runs in the same process
    (TensorFlow has no way to unset one); `determinism.configure` sets arithmetic_optimization on every run."""
    import tensorflow as tf  # noqa: PLC0415

    options = grappler_options(config.grappler)
    if options:
        tf.config.optimizer.set_experimental_options(options)


def configure_worker(config: RuntimeConfig, session_config) -> None:
    """A worker task (`trainer.system.distributed.serve`) runs the chief's ops with its server's thread pools and GPU
    options: the same settings, written into its `ConfigProto` (0/False are the proto's defaults). Its
    environment variables are set by `python -m trainer` like the chief's. --gpu_memory_limit_mb is not
    passed on (not measured on several GPU machines)."""
    session_config.inter_op_parallelism_threads = config.inter_op_threads
    session_config.intra_op_parallelism_threads = config.intra_op_threads
    session_config.gpu_options.allow_growth = config.gpu_memory_growth
    apply_grappler(config)


def describe() -> dict:
    """Every runtime setting as TensorFlow reports it now (environment variables as the process has them;
    None: unset, TensorFlow's default)."""
    import tensorflow as tf  # noqa: PLC0415
    from tensorflow.python.util import _pywrap_util_port  # noqa: PLC0415 (the only read-back of oneDNN)

    gpus = tf.config.list_physical_devices("GPU")
    return {
        ONEDNN_ENV: os.environ.get(ONEDNN_ENV),
        "onednn_enabled": bool(_pywrap_util_port.IsMklEnabled()),
        AUTOTUNE_ENV: os.environ.get(AUTOTUNE_ENV),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "gpu_memory_growth": {g.name: tf.config.experimental.get_memory_growth(g) for g in gpus},
        "gpu_memory_limit_mb": {
            g.name: [c.memory_limit for c in tf.config.get_logical_device_configuration(g) or []] for g in gpus
        },
        "grappler": tf.config.optimizer.get_experimental_options(),
    }
