"""Command-line flags of `python -m trainer`, and their conversion into a `RunConfig`.

Flag names are the public interface; every help text gives the unit and what 0 means where it matters.
"""

from __future__ import annotations

from absl import flags

from trainer.settings import config as cfg
from trainer.settings import runtime_flags

GROUP_FLAGS: dict[str, tuple[str, ...]] = {}  # `--help` heading -> names of its flags, filled by define_flags


def _groups() -> tuple:
    """(heading, what it covers, defining function) for each group, in `--help` order. A new group is one
    `_define_<topic>_flags` function and one line here: the flags that function defines are its group."""
    return (
        ("towers", "devices, batch split, update mode, precision, reproducibility", _define_tower_flags),
        ("data", "training and eval records", _define_data_flags),
        ("augmentation", "what training images look like, and the decoded-record cache", _define_augment_flags),
        ("model", "what is trained", _define_model_flags),
        ("optimizer", "update rule and learning-rate schedule", _define_optimizer_flags),
        ("loop and outputs", "how long, how often, what model_dir gets", _define_loop_flags),
        ("resume", "rerunning into an existing model_dir", _define_resume_flags),
        ("cluster", "several tasks: srun, TF_CONFIG", _define_cluster_flags),
        ("runtime", "threads, GPU memory, oneDNN, cuDNN autotuning, graph rewrites", runtime_flags.define),
    )


def group_blurbs() -> dict[str, str]:
    """`--help` heading -> the one-line description printed with it."""
    return {heading: blurb for heading, blurb, _ in _groups()}


def define_flags() -> None:
    """Defines every flag on absl's global FLAGS, recording each group's flags in `GROUP_FLAGS`; a second
    call in the same process does nothing."""
    if GROUP_FLAGS:
        return
    for heading, _, define in _groups():
        before = set(flags.FLAGS)
        define()
        GROUP_FLAGS[heading] = tuple(name for name in flags.FLAGS if name not in before)


def _define_tower_flags() -> None:
    flags.DEFINE_integer(
        "num_gpus", 1, "Towers per task (at least 1): one per device (GPU, or logical CPU with --device=cpu)."
    )
    flags.DEFINE_enum(
        "device",
        "gpu",
        list(cfg.DEVICE_KINDS),
        "Tower device kind. gpu: /gpu:0..N-1, exits at once if fewer GPUs are visible. "
        "cpu: N logical CPU devices (the same code path, for machines without GPUs).",
    )
    flags.DEFINE_enum(
        "parameter_device",
        "gpu",
        list(cfg.PARAMETER_DEVICES),
        "Where the single copy of the variables and optimizer slots lives. gpu: the first tower's "
        "device (/cpu:0 with --device=cpu). cpu: the host. spread: each variable and its slots on one "
        "tower's device, balanced by bytes; same weights bitwise, less traffic through any one device.",
    )
    flags.DEFINE_integer("global_batch_size", 128, "Examples per step, over all towers (split into micro-batches).")
    flags.DEFINE_integer(
        "micro_batches",
        0,
        "K micro-batches per step, a multiple of --num_gpus dividing the batch; "
        "0: one per tower. Fix K to make results independent of --num_gpus.",
    )
    flags.DEFINE_enum(
        "update_mode",
        "sync",
        list(cfg.UPDATE_MODES),
        "sync: the K gradients are averaged in a fixed order, then one update per step. async: each tower "
        "applies its own micro-batch gradient at once, no barrier; one step = one update of "
        "--global_batch_size/--micro_batches examples, at --learning_rate/--micro_batches, with momentum "
        "lowered to 1-N(1-momentum) for the momentum asynchrony adds. Async is NOT deterministic.",
    )
    flags.DEFINE_integer(
        "max_staleness",
        -1,
        "Async: a tower waits rather than apply an update staler than this (updates applied by other towers "
        "since it read the variables); 0 is lock-step, negative is unbounded.",
    )
    flags.DEFINE_bool(
        "xla",
        False,
        "XLA-compile the training step (jit_compile). On GPUs it fuses element-wise "
        "ops; measured effect in benchmarks/RESULTS.md.",
    )
    flags.DEFINE_enum(
        "mixed_precision",
        "",
        ["", "bf16", "fp16"],
        "Compute in bfloat16 or float16, variables in float32; fp16 adds dynamic loss scaling. Empty: float32.",
    )
    flags.DEFINE_integer("seed", 0, "Seed of weight init, data shuffle and Dropout (any integer; 0 too).")
    flags.DEFINE_bool(
        "deterministic",
        False,
        "Bitwise reproducible training (sync mode): the same weights on a "
        "rerun, for every --num_gpus dividing --micro_batches, and after resume. Costs some speed.",
    )


def _define_data_flags() -> None:
    flags.DEFINE_string(
        "train_data",
        "",
        "Glob(s), comma-separated, of training TFRecords. Empty: the built-in "
        "scikit-learn digits (built once into ~/.cache/towerflow or $TOWERFLOW_CACHE).",
    )
    flags.DEFINE_string("eval_data", "", "Glob(s) of held-out TFRecords; required with --train_data.")
    flags.DEFINE_enum(
        "record_schema",
        "auto",
        list(cfg.RECORD_SCHEMAS),
        "image: ImageNet-script keys (image/encoded, image/class/label). dense: a float vector "
        "(--feature_key) and an int64 label (--label_key). auto: decided by the first record.",
    )
    flags.DEFINE_integer("num_classes", 0, "Number of classes; required with --train_data (10 for digits).")
    flags.DEFINE_integer("label_offset", 0, "Subtracted from every label (1 for ImageNet, whose labels start at 1).")
    flags.DEFINE_list("image_size", None, "H,W to resize every image to; needed when images differ in size.")
    flags.DEFINE_string("feature_key", "features", "Dense records: key of the float feature vector.")
    flags.DEFINE_string("label_key", "label", "Dense records: key of the int64 label.")
    flags.DEFINE_integer(
        "shuffle_buffer",
        10_000,
        "Records in the shuffle buffer, at least 1 (1: file order); saved in every checkpoint.",
    )
    flags.DEFINE_integer("eval_batch_size", 0, "Examples per eval batch; 0: --global_batch_size.")
    flags.DEFINE_integer(
        "max_bad_records",
        0,
        "Corrupt training records (bad CRC, truncated file) to skip before failing (0: the first fails the "
        "run), each with the rest of its file, which the reader cannot resynchronise on; each is named on "
        "stderr once. A record that does not parse or decode, a label outside [0, --num_classes) and any "
        "bad eval record always fail the run.",
    )


def _define_model_flags() -> None:
    flags.DEFINE_string(
        "model",
        "cnn",
        "Built-in model (mlp, cnn, resnet20, resnet50) or 'package.module:function' "
        "returning a Keras model for (input_shape, num_classes).",
    )


def _define_augment_flags() -> None:
    flags.DEFINE_enum(
        "augment",
        "auto",
        list(cfg.AUGMENTS),
        "Training-image augmentation, random but keyed on each example's position in the run, so "
        "--deterministic still holds. flip: horizontal flip. crop_flip: pad H/8 (4 px at 32x32), random crop, "
        "flip. imagenet: random-resized crop (area 8-100%, aspect 3/4-4/3; a JPEG decodes only the crop) to "
        "the image size, flip; eval takes the central 87.5%. auto: crop_flip for resnet20, imagenet for "
        "resnet50, none otherwise (flipped digits change meaning) and for dense records.",
    )
    flags.DEFINE_string(
        "normalize",
        "none",
        "Per-channel normalization of [0, 1] pixels, after augmentation, in training and eval: none, imagenet "
        "(ImageNet's RGB mean and std), or MEAN,STD as numbers: the means, then the stds, one per channel "
        "(0.49,0.48,0.45,0.25,0.24,0.26) or one for all (0.5,0.25).",
    )
    flags.DEFINE_enum(
        "cache",
        "auto",
        list(cfg.CACHES),
        "memory: decode each training image once and keep it in memory (augmentation runs after the cache; "
        "same batches as none). auto: memory when the decoded training images take under 2 GiB (estimated "
        "from the file sizes and the first record), else none. Dense records are never cached.",
    )


def _define_optimizer_flags() -> None:
    flags.DEFINE_enum("optimizer", "momentum", list(cfg.OPTIMIZERS), "Optimizer (momentum: SGD with --momentum).")
    flags.DEFINE_float(
        "learning_rate", 0.05, "Peak learning rate (after warmup), per step of --global_batch_size examples."
    )
    flags.DEFINE_float("momentum", 0.9, "Momentum of --optimizer=momentum.")
    flags.DEFINE_float("weight_decay", 1e-4, "Decoupled weight decay of --optimizer=adamw.")
    flags.DEFINE_enum(
        "lr_schedule",
        "cosine",
        list(cfg.SCHEDULES),
        "cosine: linear warmup then cosine decay to 0 at --train_steps. piecewise: --lr_values "
        "between --lr_boundaries. constant: warmup then --learning_rate.",
    )
    flags.DEFINE_integer("warmup_steps", 0, "Steps of linear warmup from 0 (cosine and constant schedules); 0: none.")
    flags.DEFINE_list("lr_boundaries", [], "Piecewise schedule: step boundaries, increasing.")
    flags.DEFINE_list("lr_values", [], "Piecewise schedule: learning rates, one more than boundaries.")
    flags.DEFINE_float("clip_global_norm", 0.0, "Clip the averaged gradient to this global norm; 0: no clipping.")


def _define_loop_flags() -> None:
    flags.DEFINE_string(
        "model_dir",
        "/tmp/towerflow",
        "Checkpoints, events, metrics.json, flags.txt, export/. "
        "A rerun with the same directory resumes from its newest checkpoint.",
    )
    flags.DEFINE_integer(
        "train_steps", 1000, "Total optimizer steps (global batches), counting resumed ones; at least 1."
    )
    flags.DEFINE_integer("log_every_steps", 100, "Steps between log lines and train scalars; 0: off.")
    flags.DEFINE_integer("eval_every_steps", 500, "Steps between evaluations (also one at the end); 0: end only.")
    flags.DEFINE_integer("checkpoint_every_steps", 500, "Steps between checkpoints (also one at the end); 0: end only.")
    flags.DEFINE_integer(
        "histogram_every_steps",
        100,
        "Steps between gradient and weight histograms; 0: off. Each one costs about one extra step time.",
    )
    flags.DEFINE_list(
        "profile_steps",
        None,
        "A,B: record a TensorFlow profiler trace of steps A+1..B into "
        "model_dir/train (TensorBoard's Profile tab, with tensorboard-plugin-profile).",
    )
    flags.DEFINE_integer(
        "steps_per_call",
        0,
        "Sync: steps per tf.function call, run in an in-graph loop (same bits for any value; a stop signal "
        "still ends the run after the step in progress); 0: auto, calls of ~0.5 s.",
    )
    flags.DEFINE_integer("keep_checkpoints", 3, "Newest checkpoints kept, at least 1.")
    flags.DEFINE_integer(
        "max_requeues",
        3,
        "Under Slurm: on SIGUSR1/SIGUSR2 (the time-limit warning, sbatch --signal=B:USR1@T) the run "
        "checkpoints and requeues its job with `scontrol requeue`, at most this many times per job; 0: never. "
        "Preemption (SIGTERM) requeues are Slurm's own (--requeue) and not counted.",
    )
    flags.DEFINE_bool(
        "export",
        True,
        "At the end, export a SavedModel to model_dir/export/<step>/ (kept if it exists; README: Serving).",
    )


def _define_resume_flags() -> None:
    flags.DEFINE_bool(
        "allow_flag_changes",
        False,
        "Resume a --model_dir although these flags change settings that define its run (seed, model, data, "
        "augmentation, batch, micro-batches, optimizer, schedule, precision, update mode); without it such a resume is "
        "refused with the list of differences. Always free to change: --train_steps, the *_every_steps "
        "cadences, --keep_checkpoints, --export, --profile_steps, --max_requeues, --eval_data, "
        "--eval_batch_size, --cache, --device, --parameter_device, --xla, the runtime flags and, in sync mode, "
        "--num_gpus.",
    )


def _define_cluster_flags() -> None:
    flags.DEFINE_integer(
        "cluster_port",
        0,
        "Several tasks (srun, TF_CONFIG): the gRPC port of the first task on each node, the next ones using "
        "the following ports. 0: derived from SLURM_JOB_ID (12000 + 8 * (id % 2500)), so two jobs sharing a "
        "node do not collide. TF_CONFIG gives its own ports.",
    )
    flags.DEFINE_float(
        "cluster_timeout_sec",
        300.0,
        "Several tasks: seconds the chief waits for every worker's server, and a worker for the chief, before failing.",
    )


def _ints(values, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in values or ())
    except ValueError as e:
        raise cfg.ConfigError(f"--{name} ({','.join(values)}) must be comma-separated integers") from e


def _floats(values, name: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in values or ())
    except ValueError as e:
        raise cfg.ConfigError(f"--{name} ({','.join(values)}) must be comma-separated numbers") from e


def _profile_steps(values) -> tuple[int, int] | None:
    if not values:
        return None
    steps = _ints(values, "profile_steps")
    if len(steps) != 2:
        raise cfg.ConfigError(f"--profile_steps ({','.join(values)}) must be two steps A,B")
    return steps


def config_from_flags(f) -> cfg.RunConfig:
    """Converts parsed flags into a validated `RunConfig`.

    Raises:
      ConfigError: a value is out of range or inconsistent with another.
    """
    image_size = _ints(f.image_size, "image_size") if f.image_size else None
    config = cfg.RunConfig(
        data=cfg.DataConfig(
            f.train_data,
            f.eval_data,
            f.record_schema,
            f.num_classes,
            f.label_offset,
            image_size,
            f.feature_key,
            f.label_key,
            f.shuffle_buffer,
            f.eval_batch_size,
            f.max_bad_records,
            augment=f.augment,
            normalize=f.normalize,
            cache=f.cache,
        ),
        model=cfg.ModelConfig(f.model),
        optimizer=cfg.OptimizerConfig(
            f.optimizer,
            f.learning_rate,
            f.momentum,
            f.weight_decay,
            f.lr_schedule,
            f.warmup_steps,
            _ints(f.lr_boundaries, "lr_boundaries"),
            _floats(f.lr_values, "lr_values"),
            f.clip_global_norm,
        ),
        towers=cfg.TowerConfig(
            f.num_gpus,
            f.device,
            f.parameter_device,
            f.global_batch_size,
            f.micro_batches,
            f.update_mode,
            f.max_staleness,
            f.xla,
            f.mixed_precision,
        ),
        loop=cfg.LoopConfig(
            f.model_dir,
            f.train_steps,
            f.log_every_steps,
            f.eval_every_steps,
            f.checkpoint_every_steps,
            f.histogram_every_steps,
            f.keep_checkpoints,
            f.export,
            _profile_steps(f.profile_steps),
            f.max_requeues,
            f.allow_flag_changes,
            f.cluster_timeout_sec,
            steps_per_call=f.steps_per_call,
        ),
        runtime=runtime_flags.config_from(f),
        seed=f.seed,
        deterministic=f.deterministic,
    )
    return cfg.validate(config)


def flagfile_text(f, module_name: str) -> str:
    """An absl flagfile with every towerflow flag's value (`module_name`'s and the runtime group's), so
    `--flagfile=` reproduces the run."""
    modules = (module_name, runtime_flags.__name__)  # the runtime group is defined in its own module
    defined = [flag for module in modules for flag in f.get_flags_for_module(module)]
    lines = [flag.serialize() for flag in sorted(defined, key=lambda x: x.name)]
    return "\n".join(line for line in lines if line) + "\n"
