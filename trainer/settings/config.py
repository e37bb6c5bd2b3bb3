"""The run's settings: typed, frozen dataclasses grouped by concern, and the value types of their fields.

A `RunConfig` is what every part of the trainer reads; none of them reads a flag or re-parses a string.
It comes from the flag table (`trainer.settings.table`, through `trainer.settings.flags`) or from a library
caller, and goes through `trainer.settings.resolve.resolve` once: validated (`trainer.settings.validate`) and
with what the settings alone decide resolved (`--augment=auto`, the task count). The field defaults here are
the flags' defaults.
"""

from __future__ import annotations

import dataclasses

import tasks
from trainer.settings.errors import ConfigError
from trainer.settings.splits import Pipeline, TensorSplit, layout_pairs

DEVICE_KINDS = ("gpu", "cpu")
PARAMETER_DEVICES = ("gpu", "cpu", "spread")
PIPELINE_SCHEDULES = ("1f1b", "gpipe")
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


@dataclasses.dataclass(frozen=True)
class Normalization:
    """--normalize, parsed: per-channel means and standard deviations of [0, 1] pixels; empty for none.

    One value per list stands for every channel; `parse` keeps one value when every channel has the same, so
    equal normalizations compare (and are recorded) equal whatever their spelling.
    """

    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Normalization:
        """ "none", "imagenet" (ImageNet's RGB mean and std), or an even count of comma-separated numbers: the
        means, then as many stds.

        Raises:
          ConfigError: anything else, or a std that is not positive.
        """
        if text == "none":
            return cls()
        if text == "imagenet":
            return cls(IMAGENET_MEAN, IMAGENET_STD)
        try:
            values = tuple(float(v) for v in text.split(","))
        except ValueError:
            values = ()
        if len(values) < 2 or len(values) % 2:
            raise ConfigError(
                f"--normalize ({text!r}) must be none, imagenet, or MEAN,STD as comma-separated numbers: the means, "
                "then as many stds (one per channel, e.g. 0.49,0.48,0.45,0.25,0.24,0.26, or one for all, e.g. "
                "0.5,0.25)"
            )
        mean, std = values[: len(values) // 2], values[len(values) // 2 :]
        if min(std) <= 0:
            raise ConfigError(f"--normalize ({text!r}): every std must be positive (got {list(std)})")
        if len(set(mean)) == 1 and len(set(std)) == 1:
            mean, std = mean[:1], std[:1]
        return cls(mean, std)

    def __bool__(self) -> bool:
        return bool(self.mean)

    @property
    def text(self) -> str:
        """The one spelling of this normalization: none, imagenet, or MEAN,STD (a --normalize value)."""
        if not self:
            return "none"
        if (self.mean, self.std) == (IMAGENET_MEAN, IMAGENET_STD):
            return "imagenet"
        return ",".join(repr(v) for v in (*self.mean, *self.std))

    def per_channel(self, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(means, stds), one of each per channel of images with `channels` channels.

        Raises:
          ConfigError: the values are for another number of channels.
        """
        if len(self.mean) not in (1, channels):
            raise ConfigError(
                f"--normalize={self.text} gives {len(self.mean)} means and stds, but the images have {channels} "
                "channel(s): give one per channel, or one for all"
            )
        repeat = channels // len(self.mean)
        return self.mean * repeat, self.std * repeat


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
    augment: str = "auto"  # auto: by model family; resolved to the kind by `resolve` (trainer.settings.preprocess)
    augment_auto: bool = False  # `augment` was chosen by --augment=auto (set by `resolve`; not a flag)
    normalize: Normalization = Normalization()  # --normalize, parsed once (`Normalization.parse`)
    cache: str = "auto"  # auto: decoded training images in memory when below data.AUTO_CACHE_BYTES
    group_by_length: int = 0  # a task's variable-length records: batches per length-sorted pool; 0: none


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    name: str = "cnn"


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """The workload (`tasks`): which task, and its own options. The engine knows no task by name: a built-in
    task declares its typed arguments (`tasks.options`), whose values `options` holds (the named task's only,
    every one of them once `resolve` has run); a user task reads `--task_args`."""

    name: str = tasks.DEFAULT  # a built-in task (tasks.BUILT_IN) or "package.module:Class"
    args: tuple[tuple[str, str], ...] = ()  # --task_args=key=value,...: a user task's own options, as text
    options: tuple[tuple[str, object], ...] = ()  # a built-in task's declared arguments; a dict is accepted

    def __post_init__(self):
        if isinstance(self.options, dict):  # TaskConfig(name=..., options={"width": 64}): one spelling, sorted
            object.__setattr__(self, "options", tuple(sorted(self.options.items())))

    @property
    def arg_dict(self) -> dict[str, str]:
        """--task_args as a dict."""
        return dict(self.args)

    @property
    def option_dict(self) -> dict[str, object]:
        """The task's declared arguments as a dict (`tasks.options.Options.values` fills in the defaults)."""
        return dict(self.options)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    name: str = "momentum"
    learning_rate: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 1e-4  # adamw only
    beta2: float = 0.999  # adam and adamw
    schedule: str = "cosine"
    warmup_steps: int = 0
    min_learning_rate: float = 0.0  # cosine: where the decay ends
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
    pipeline_stages: int = 1  # S: the model cut into S stages, each on its own device (trainer.step.pipeline.runner)
    pipeline_schedule: str = "1f1b"
    pipeline_cuts: tuple[str, ...] = ()  # the pieces that end stages 0..S-2 (models.stages.cut); empty: by bytes
    pipeline_remat: bool = False  # each stage recomputes its forward in its backward (trainer.step.pipeline)
    fuse_transfers: bool = True  # sync, several tasks: one buffer per (device, device, dtype) (trainer.step.transfers)
    tensor_parallel: int = 1  # T: devices per tower, each layer split over them (models.sharded)
    tensor_shards: int = 0  # N: shards of each split layer; 0: T
    tensor_layout: tuple[str, ...] = ()  # "PATTERN=column|row|heads": a model's layers split (models.layout)
    num_tasks: int = 1  # machines (tasks) of the run, from Slurm or TF_CONFIG (launch.job.cluster); not a flag

    @property
    def tensor(self) -> TensorSplit:
        """The --tensor_* settings as one value, what the model, the placement and the runners read."""
        layout = layout_pairs(self.tensor_layout)
        shards = self.tensor_shards or self.tensor_parallel
        return TensorSplit(self.tensor_parallel, shards, layout, shards_set=bool(self.tensor_shards))

    @property
    def towers_per_task(self) -> int:
        """Towers on each task: --num_gpus devices, T to a tower."""
        return self.num_towers // self.tensor_parallel

    @property
    def total_towers(self) -> int:
        """Towers of the whole run: --num_gpus / T on each of `num_tasks` tasks."""
        return self.towers_per_task * self.num_tasks

    @property
    def pipeline(self) -> Pipeline:
        """The --pipeline_* settings as one value, what the step and the model's placement read."""
        return Pipeline(self.pipeline_stages, self.pipeline_schedule, self.pipeline_cuts, self.pipeline_remat)

    @property
    def num_pipelines(self) -> int:
        """Pipelines of the whole run: each of S stages on its own device, so total towers / S."""
        return self.total_towers // self.pipeline.stages

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
    max_requeues: int = 3  # Slurm: requeues in a row without a step trained (see launch/job/requeue.py)
    allow_flag_changes: bool = False  # resume although settings that define the run changed (trainer/outputs/rundir.py)
    steps_per_call: int = 0  # sync: steps per tf.function call (trainer.step.core.calls); 0: auto


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """How TensorFlow runs (threads, memory, kernels, graph rewrites): not what is trained (trainer.system.runtime)."""

    onednn: str = "auto"  # TF_ENABLE_ONEDNN_OPTS, read when TensorFlow is imported
    inter_op_threads: int = 0  # 0: TensorFlow's default
    intra_op_threads: int = 0
    gpu_memory_growth: bool = False
    gpu_memory_limit_mb: int = 0  # 0: no limit
    device_memory_mb: int = 0  # a step's counted bytes per device must fit this; 0: not checked (stepmemory)
    cudnn_autotune: str = "auto"  # TF_CUDNN_USE_AUTOTUNE; auto: off under --deterministic
    grappler: str = ""  # NAME=on|off,... (see `grappler_options`)


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Several tasks (srun, TF_CONFIG): how they find and wait for each other (`launch.job.cluster`)."""

    port: int = 0  # gRPC port of a node's first task; 0: derived from SLURM_JOB_ID
    timeout_sec: float = 300.0  # how long chief and workers wait for each other at the start
    peer_timeout_sec: float = 60.0  # once running: how long any task may go without an answer from a peer


@dataclasses.dataclass(frozen=True)
class RunConfig:
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    towers: TowerConfig = TowerConfig()
    loop: LoopConfig = LoopConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    cluster: ClusterConfig = ClusterConfig()
    seed: int = 0
    deterministic: bool = False
    flags_text: str = ""  # the absl flagfile that reproduces this run, written to model_dir/flags.txt


def flatten(config: RunConfig) -> dict:
    """The run's settings as one flat dict (`towers.num_towers`, `optimizer.learning_rate`, `seed`, ...); the
    task's declared arguments each as `task.<name>` (`task.width`), as a run of 0.7.0 recorded them."""
    flat = {}
    for group, values in dataclasses.asdict(config, dict_factory=_with_normalization_text).items():
        if isinstance(values, dict):
            flat.update({f"{group}.{k}": v for k, v in values.items()})
        elif group != "flags_text":
            flat[group] = values
    del flat["task.options"]
    flat.update({f"task.{k}": v for k, v in config.task.options})
    return flat


def _with_normalization_text(items: list[tuple[str, object]]) -> dict:
    """`dataclasses.asdict`'s dict factory, with a `Normalization` as its --normalize text (a nested dataclass
    reaches the factory as its fields; its own dict is recognised by them)."""
    values = dict(items)
    if set(values) == {"mean", "std"}:
        return Normalization(tuple(values["mean"]), tuple(values["std"])).text
    return values


def grappler_options(text: str) -> dict[str, bool]:
    """--grappler as {option: on}, e.g. "layout_optimizer=off,remapping=off" -> {"layout_optimizer": False, ...}.

    Raises:
      ConfigError: an entry that is not NAME=on|off, or a NAME TensorFlow does not accept (listing them).
    """
    options = {}
    for entry in filter(None, text.split(",")):
        name, _, value = entry.partition("=")
        if value not in ("on", "off"):
            raise ConfigError(f"--grappler entry {entry!r} must be NAME=on or NAME=off")
        if name not in GRAPPLER_OPTIONS:
            raise ConfigError(f"--grappler: unknown option {name!r}; TensorFlow accepts {', '.join(GRAPPLER_OPTIONS)}")
        options[name] = value == "on"
    return options
