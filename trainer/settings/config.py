"""Typed, frozen run configuration, grouped by concern.

Only `trainer/__main__.py` reads absl flags; it converts them once into a `RunConfig`. Everything below takes
these objects, so the trainer is usable as a library and testable without flags. `validate()` runs before
TensorFlow is imported, so bad input fails fast with a message that names the flag and says what to change.
"""

from __future__ import annotations

import dataclasses

DEVICE_KINDS = ("gpu", "cpu")
PARAMETER_DEVICES = ("gpu", "cpu", "spread")
UPDATE_MODES = ("sync", "async")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
SCHEDULES = ("constant", "cosine", "piecewise")
RECORD_SCHEMAS = ("auto", "image", "dense")
MIXED_PRECISION = ("", "bf16", "fp16")
AUGMENTS = ("auto", "none", "flip", "crop_flip", "imagenet")
CACHES = ("auto", "memory", "none")
SWITCHES = ("auto", "on", "off")  # --onednn, --cudnn_autotune; auto: TensorFlow's default
# --grappler names: the on/off rewriter options tf.config.optimizer.set_experimental_options turns into
# RewriterConfig fields (TF 2.21, tensorflow/python/eager/context.py); min_graph_nodes is a number, left out.
GRAPPLER_OPTIONS = (
    "layout_optimizer",
    "constant_folding",
    "shape_optimization",
    "remapping",
    "arithmetic_optimization",
    "dependency_optimization",
    "loop_optimization",
    "function_optimization",
    "debug_stripper",
    "disable_model_pruning",
    "scoped_allocator_optimization",
    "pin_to_host_optimization",
    "implementation_selector",
    "auto_mixed_precision",
    "use_plugin_optimizers",
    "disable_meta_optimizer",
    "auto_mixed_precision_onednn_bfloat16",
    "auto_mixed_precision_mkl",
)
# --normalize=imagenet: the per-channel mean and standard deviation of ImageNet's RGB pixels on [0, 1].
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the flag and what to change."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the examples come from. Empty `train_data` means the built-in digits dataset."""

    train_data: str = ""
    eval_data: str = ""
    record_schema: str = "auto"
    num_classes: int = 0
    label_offset: int = 0
    image_size: tuple[int, int] | None = None
    feature_key: str = "features"
    label_key: str = "label"
    shuffle_buffer: int = 10_000
    eval_batch_size: int = 0  # 0: the global batch size
    max_bad_records: int = 0  # corrupt training records (bad CRC, truncated file) skipped before failing
    augment: str = "auto"  # auto: by model family (trainer/settings/preprocess.py AUTO_AUGMENT)
    normalize: str = "none"  # none, imagenet, or MEAN,...,STD,... (see `normalization`)
    cache: str = "auto"  # auto: decoded training images in memory when below data.AUTO_CACHE_BYTES


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    name: str = "cnn"


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    name: str = "momentum"
    learning_rate: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 1e-4  # adamw only
    schedule: str = "cosine"
    warmup_steps: int = 0
    boundaries: tuple[int, ...] = ()  # piecewise: step boundaries
    values: tuple[float, ...] = ()  # piecewise: one more value than boundaries
    clip_global_norm: float = 0.0  # 0: no clipping


@dataclasses.dataclass(frozen=True)
class TowerConfig:
    """Which devices compute, and how the global batch is cut between them."""

    num_towers: int = 1  # --num_gpus: towers on each task (machine)
    device: str = "gpu"
    parameter_device: str = "gpu"
    global_batch_size: int = 128
    micro_batches: int = 0  # 0: one per tower
    update_mode: str = "sync"
    max_staleness: int = -1  # async: bound on an update's staleness; negative: unbounded
    jit_compile: bool = False  # XLA-compile the step
    mixed_precision: str = ""  # "", "bf16" or "fp16" (with dynamic loss scaling)
    num_tasks: int = 1  # machines (tasks) of the run, from Slurm or TF_CONFIG (launch.cluster); not a flag

    @property
    def total_towers(self) -> int:
        """Towers of the whole run: --num_gpus on each of `num_tasks` tasks."""
        return self.num_towers * self.num_tasks

    @property
    def num_micro_batches(self) -> int:
        return self.micro_batches or self.total_towers

    @property
    def micro_batch_size(self) -> int:
        return self.global_batch_size // self.num_micro_batches


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    model_dir: str = "/tmp/towerflow"
    train_steps: int = 1000
    log_every_steps: int = 100
    eval_every_steps: int = 500
    checkpoint_every_steps: int = 500
    histogram_every_steps: int = 100
    keep_checkpoints: int = 3
    export: bool = True
    profile_steps: tuple[int, int] | None = None  # (A, B): profiler trace of steps A+1..B
    max_requeues: int = 3  # Slurm: time-limit requeues one job may make (see launch/requeue.py)
    allow_flag_changes: bool = False  # resume although settings that define the run changed (trainer/outputs/rundir.py)
    cluster_timeout_sec: float = 300.0  # several tasks: how long chief and workers wait for each other
    steps_per_call: int = 0  # sync: steps per tf.function call (trainer.step.calls); 0: auto


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """How TensorFlow runs (threads, memory, kernels, graph rewrites): not what is trained (trainer.system.runtime)."""

    onednn: str = "auto"  # TF_ENABLE_ONEDNN_OPTS, read when TensorFlow is imported
    inter_op_threads: int = 0  # 0: TensorFlow's default
    intra_op_threads: int = 0
    gpu_memory_growth: bool = False
    gpu_memory_limit_mb: int = 0  # 0: no limit
    cudnn_autotune: str = "auto"  # TF_CUDNN_USE_AUTOTUNE; auto: off under --deterministic
    grappler: str = ""  # NAME=on|off,... (see `grappler_options`)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    towers: TowerConfig = TowerConfig()
    loop: LoopConfig = LoopConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    seed: int = 0
    deterministic: bool = False
    flags_text: str = ""  # the absl flagfile that reproduces this run, written to model_dir/flags.txt


def flatten(config: RunConfig) -> dict:
    """The run's settings as one flat dict (`towers.num_towers`, `optimizer.learning_rate`, `seed`, ...)."""
    flat = {}
    for group, values in dataclasses.asdict(config).items():
        if isinstance(values, dict):
            flat.update({f"{group}.{k}": v for k, v in values.items()})
        elif group != "flags_text":
            flat[group] = values
    return flat


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _validate_towers(t: TowerConfig) -> None:
    _require(t.num_towers >= 1, f"--num_gpus ({t.num_towers}) must be at least 1")
    _require(t.device in DEVICE_KINDS, f"--device ({t.device!r}) must be one of {DEVICE_KINDS}")
    _require(
        t.parameter_device in PARAMETER_DEVICES,
        f"--parameter_device ({t.parameter_device!r}) must be one of {PARAMETER_DEVICES}",
    )
    _require(t.update_mode in UPDATE_MODES, f"--update_mode ({t.update_mode!r}) must be one of {UPDATE_MODES}")
    _require(
        t.mixed_precision in MIXED_PRECISION,
        f"--mixed_precision ({t.mixed_precision!r}) must be one of {MIXED_PRECISION[1:]} or empty",
    )
    _require(t.global_batch_size >= 1, f"--global_batch_size ({t.global_batch_size}) must be at least 1")
    k = t.num_micro_batches
    _require(k >= 1, f"--micro_batches ({t.micro_batches}) must be at least 1 (or 0 for one per tower)")
    tasks = f" x {t.num_tasks} tasks" if t.num_tasks > 1 else ""
    _require(
        k % t.total_towers == 0,
        f"--micro_batches ({k}) must be a multiple of the towers (--num_gpus={t.num_towers}{tasks}) so every "
        f"tower gets the same number of micro-batches",
    )
    _require(
        t.global_batch_size % k == 0,
        f"--global_batch_size ({t.global_batch_size}) must be divisible by --micro_batches ({k})",
    )


def _validate_optimizer(o: OptimizerConfig, train_steps: int) -> None:
    _require(o.name in OPTIMIZERS, f"--optimizer ({o.name!r}) must be one of {OPTIMIZERS}")
    _require(o.learning_rate > 0, f"--learning_rate ({o.learning_rate}) must be positive")
    _require(o.schedule in SCHEDULES, f"--lr_schedule ({o.schedule!r}) must be one of {SCHEDULES}")
    _require(
        0 <= o.warmup_steps < train_steps,
        f"--warmup_steps ({o.warmup_steps}) must be in [0, --train_steps ({train_steps}))",
    )
    _require(o.clip_global_norm >= 0, f"--clip_global_norm ({o.clip_global_norm}) must be >= 0")
    if o.schedule == "piecewise":
        _require(
            len(o.values) == len(o.boundaries) + 1,
            f"--lr_values needs one more value than --lr_boundaries has boundaries "
            f"(got {len(o.values)} values, {len(o.boundaries)} boundaries)",
        )
        _require(
            list(o.boundaries) == sorted(set(o.boundaries)),
            f"--lr_boundaries ({list(o.boundaries)}) must be strictly increasing",
        )


def _validate_loop(lp: LoopConfig) -> None:
    _require(bool(lp.model_dir), "--model_dir must not be empty")
    _require(lp.train_steps >= 1, f"--train_steps ({lp.train_steps}) must be at least 1")
    for name in ("log_every_steps", "eval_every_steps", "checkpoint_every_steps", "histogram_every_steps"):
        value = getattr(lp, name)
        _require(value >= 0, f"--{name} ({value}) must be >= 0 (0 turns it off)")
    if lp.profile_steps is not None:
        a, b = lp.profile_steps
        _require(
            0 <= a < b <= lp.train_steps,
            f"--profile_steps ({a},{b}) must be A,B with 0 <= A < B <= --train_steps ({lp.train_steps})",
        )
    _require(lp.keep_checkpoints >= 1, f"--keep_checkpoints ({lp.keep_checkpoints}) must be at least 1")
    _require(lp.cluster_timeout_sec > 0, f"--cluster_timeout_sec ({lp.cluster_timeout_sec}) must be positive")
    _require(lp.max_requeues >= 0, f"--max_requeues ({lp.max_requeues}) must be >= 0 (0: never requeue)")
    _require(lp.steps_per_call >= 0, f"--steps_per_call ({lp.steps_per_call}) must be >= 0 (0: auto)")


def normalization(text: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """--normalize as (means, stds) on [0, 1] pixels, or None for "none".

    "imagenet" is ImageNet's RGB mean and std; otherwise an even count of comma-separated numbers: the first
    half the means, the second the stds, one per channel or one for every channel (e.g. "0.5,0.25").

    Raises:
      ConfigError: anything else, or a std that is not positive.
    """
    if text == "none":
        return None
    if text == "imagenet":
        return IMAGENET_MEAN, IMAGENET_STD
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    _require(
        len(values) >= 2 and len(values) % 2 == 0,
        f"--normalize ({text!r}) must be none, imagenet, or MEAN,STD as comma-separated numbers: the means, then "
        "as many stds (one per channel, e.g. 0.49,0.48,0.45,0.25,0.24,0.26, or one for all, e.g. 0.5,0.25)",
    )
    mean, std = values[: len(values) // 2], values[len(values) // 2 :]
    _require(min(std) > 0, f"--normalize ({text!r}): every std must be positive (got {list(std)})")
    return mean, std


def grappler_options(text: str) -> dict[str, bool]:
    """--grappler as {option: on}, e.g. "layout_optimizer=off,remapping=off" -> {"layout_optimizer": False, ...}.

    Raises:
      ConfigError: an entry that is not NAME=on|off, or a NAME TensorFlow does not accept (listing them).
    """
    options = {}
    for entry in filter(None, text.split(",")):
        name, _, value = entry.partition("=")
        _require(value in ("on", "off"), f"--grappler entry {entry!r} must be NAME=on or NAME=off")
        _require(
            name in GRAPPLER_OPTIONS,
            f"--grappler: unknown option {name!r}; TensorFlow accepts {', '.join(GRAPPLER_OPTIONS)}",
        )
        options[name] = value == "on"
    return options


def _validate_runtime(r: RuntimeConfig, device: str, deterministic: bool) -> None:
    _require(r.onednn in SWITCHES, f"--onednn ({r.onednn!r}) must be one of {SWITCHES}")
    _require(r.cudnn_autotune in SWITCHES, f"--cudnn_autotune ({r.cudnn_autotune!r}) must be one of {SWITCHES}")
    for name in ("inter_op_threads", "intra_op_threads", "gpu_memory_limit_mb"):
        value = getattr(r, name)
        _require(value >= 0, f"--{name} ({value}) must be >= 0 (0: TensorFlow's default)")
    if device == "cpu":
        for name in ("gpu_memory_growth", "gpu_memory_limit_mb"):
            _require(
                not getattr(r, name),
                f"--{name} cannot apply with --device=cpu: the GPUs are hidden from TensorFlow; drop the flag",
            )
    _require(
        not (r.gpu_memory_growth and r.gpu_memory_limit_mb),
        "--gpu_memory_growth and --gpu_memory_limit_mb cannot be combined: TensorFlow refuses memory growth on a "
        "GPU given a memory limit (a logical device configuration); pass one of them",
    )
    _require(
        not (r.cudnn_autotune == "on" and deterministic),
        "--cudnn_autotune=on cannot be --deterministic: autotuning picks cuDNN algorithms by timing them, and op "
        "determinism already forces deterministic ones; drop --cudnn_autotune (auto is off under --deterministic)",
    )
    options = grappler_options(r.grappler)
    _require(
        not (options.get("arithmetic_optimization") and deterministic),
        "--grappler=arithmetic_optimization=on cannot be --deterministic: it reorders the fixed-order gradient "
        "sums, so one tower and two differ by an ulp; drop it",
    )


def _validate_data(d: DataConfig) -> None:
    _require(
        d.record_schema in RECORD_SCHEMAS, f"--record_schema ({d.record_schema!r}) must be one of {RECORD_SCHEMAS}"
    )
    if d.train_data:
        _require(d.num_classes >= 2, f"--num_classes ({d.num_classes}) must be given (>= 2) with --train_data")
        _require(bool(d.eval_data), "--eval_data must be given with --train_data (file glob of held-out records)")
    else:
        _require(not d.eval_data, "--eval_data needs --train_data (without both, the built-in digits are used)")
    _require(d.shuffle_buffer >= 1, f"--shuffle_buffer ({d.shuffle_buffer}) must be at least 1")
    _require(d.eval_batch_size >= 0, f"--eval_batch_size ({d.eval_batch_size}) must be >= 0")
    _require(d.max_bad_records >= 0, f"--max_bad_records ({d.max_bad_records}) must be >= 0")
    _require(d.augment in AUGMENTS, f"--augment ({d.augment!r}) must be one of {AUGMENTS}")
    _require(d.cache in CACHES, f"--cache ({d.cache!r}) must be one of {CACHES}")
    normalization(d.normalize)
    if d.image_size is not None:
        _require(
            len(d.image_size) == 2 and min(d.image_size) >= 1,
            f"--image_size ({d.image_size}) must be two positive integers H,W",
        )


def validate(config: RunConfig) -> RunConfig:
    """Checks every value that needs no TensorFlow; returns `config` unchanged.

    Raises:
      ConfigError: naming the offending flag, its value, and what to change.
    """
    _validate_towers(config.towers)
    _require(
        not (config.deterministic and config.towers.update_mode == "async"),
        "--update_mode=async cannot be --deterministic: async updates land in thread-timing order. "
        "Use --update_mode=sync for bitwise reproducible training.",
    )
    _require(
        not (config.towers.mixed_precision == "fp16" and config.towers.update_mode == "async"),
        "--mixed_precision=fp16 cannot be --update_mode=async: a gradient in flight would be unscaled with the "
        "loss scale of the moment it lands, not the one it was computed with (2x or 0.5x updates). Use "
        "--mixed_precision=bf16 (no loss scaling) with async, or sync with fp16.",
    )
    _require(
        not (config.loop.steps_per_call and config.towers.update_mode == "async"),
        f"--steps_per_call ({config.loop.steps_per_call}) is for --update_mode=sync: async towers apply one "
        "update per call each, in their own threads. Leave it at 0 with async.",
    )
    _validate_loop(config.loop)
    _validate_optimizer(config.optimizer, config.loop.train_steps)
    _validate_data(config.data)
    _validate_runtime(config.runtime, config.towers.device, config.deterministic)
    return config
