"""Every check of a `RunConfig` that needs no TensorFlow: each flag's own (the table's `check` and `choices`),
then the rules that tie several settings together. Runs once, in `trainer.settings.resolve.resolve`, before
TensorFlow is imported, so bad input fails fast with a message that names the flag and says what to change.
Rules that belong to one update mode are the mode's (`trainer.step.modes`); the pipeline's, which need the
mode, are the `Pipeline` value's own (`trainer.settings.config.Pipeline.check`, run by `modes.settle`).
"""

from __future__ import annotations

import tasks
from trainer.settings import config as cfg
from trainer.settings import table


def require(ok: bool, message: str) -> None:
    """Raises `ConfigError(message)` unless `ok`."""
    if not ok:
        raise cfg.ConfigError(message)


def validate(config: cfg.RunConfig) -> cfg.RunConfig:
    """Checks `config`; returns it unchanged.

    Raises:
      ConfigError: naming the offending flag, its value, and what to change.
    """
    for flag in table.FLAGS:
        if flag.task:  # a task's own argument: the task checks it (`_task`)
            continue
        value = table.setting(config, flag.field)
        if flag.choices:
            require(value in flag.choices, f"--{flag.name} ({value!r}) must be one of {flag.choices}")
        problem = flag.check(value) if flag.check else ""
        require(not problem, f"--{flag.name} ({_shown(value)}) {problem}")
    _towers(config.towers)
    _optimizer(config.optimizer, config.loop.train_steps)
    _loop(config.loop)
    _task(config)
    _data(config.data)
    _runtime(config.runtime, config.towers.device, config.deterministic)
    return config


def _shown(value) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return repr(value) if isinstance(value, str) else str(value)


def _towers(t: cfg.TowerConfig) -> None:
    k = t.num_micro_batches
    require(k >= 1, f"--micro_batches ({t.micro_batches}) must be at least 1 (or 0 for one per tower)")
    tasks = f" x {t.num_tasks} tasks" if t.num_tasks > 1 else ""
    split = f" / --tensor_parallel={t.tensor_parallel}" if t.tensor_parallel > 1 else ""
    require(
        k % t.total_towers == 0,
        f"--micro_batches ({k}) must be a multiple of the towers (--num_gpus={t.num_towers}{split}{tasks}) so "
        f"every tower gets the same number of micro-batches"
        f"{_task_counts(k, t.towers_per_task) if t.num_tasks > 1 else ''}",
    )
    require(
        t.global_batch_size % k == 0,
        f"--global_batch_size ({t.global_batch_size}) must be divisible by --micro_batches ({k})",
    )


def task_counts(micro_batches: int, towers_per_task: int) -> list[int]:
    """The numbers of tasks (nodes x tasks per node) that split `micro_batches` evenly over their towers."""
    if micro_batches % towers_per_task:
        return []
    per_task = micro_batches // towers_per_task
    return [m for m in range(1, per_task + 1) if per_task % m == 0]


def _task_counts(micro_batches: int, towers_per_task: int) -> str:
    counts = task_counts(micro_batches, towers_per_task)
    if not counts:
        return f"; no number of tasks does while it is not a multiple of --num_gpus ({towers_per_task})"
    return f"; with --num_gpus={towers_per_task}, these numbers of tasks do: {', '.join(map(str, counts))}"


def _task(config: cfg.RunConfig) -> None:
    """The task's own checks, before TensorFlow: a built-in's declared arguments and its rules on the run's
    settings (`tasks.check_settings`: e.g. the language model's heads dividing its width)."""
    names = ", ".join(sorted(tasks.BUILT_IN))
    require(bool(config.task.name), f"--task must name a task: {names} or 'package.module:Class'")
    problem = tasks.check_settings(config)
    require(not problem, problem)


def _optimizer(o: cfg.OptimizerConfig, train_steps: int) -> None:
    require(
        0 <= o.warmup_steps < train_steps,
        f"--warmup_steps ({o.warmup_steps}) must be in [0, --train_steps ({train_steps}))",
    )
    require(
        o.min_learning_rate < o.learning_rate,
        f"--min_learning_rate ({o.min_learning_rate}) must be below --learning_rate ({o.learning_rate})",
    )
    if o.schedule == "piecewise":
        require(
            len(o.values) == len(o.boundaries) + 1,
            f"--lr_values needs one more value than --lr_boundaries has boundaries "
            f"(got {len(o.values)} values, {len(o.boundaries)} boundaries)",
        )
        require(
            list(o.boundaries) == sorted(set(o.boundaries)),
            f"--lr_boundaries ({list(o.boundaries)}) must be strictly increasing",
        )


def _loop(lp: cfg.LoopConfig) -> None:
    if lp.profile_steps is not None:
        a, b = lp.profile_steps
        require(
            0 <= a < b <= lp.train_steps,
            f"--profile_steps ({a},{b}) must be A,B with 0 <= A < B <= --train_steps ({lp.train_steps})",
        )


def _data(d: cfg.DataConfig) -> None:
    # --num_classes is asked by the task whose records carry class labels (its rule, in `_task`).
    if d.train_data:
        require(bool(d.eval_data), "--eval_data must be given with --train_data (file glob of held-out records)")
    else:
        require(not d.eval_data, "--eval_data needs --train_data (without both, the built-in digits are used)")
    require(
        isinstance(d.normalize, cfg.Normalization),
        f"--normalize ({d.normalize!r}) must be a Normalization (Normalization.parse of the flag's text)",
    )


def _runtime(r: cfg.RuntimeConfig, device: str, deterministic: bool) -> None:
    if device == "cpu":
        for name in ("gpu_memory_growth", "gpu_memory_limit_mb"):
            require(
                not getattr(r, name),
                f"--{name} cannot apply with --device=cpu: the GPUs are hidden from TensorFlow; drop the flag",
            )
    require(
        not (r.gpu_memory_growth and r.gpu_memory_limit_mb),
        "--gpu_memory_growth and --gpu_memory_limit_mb cannot be combined: TensorFlow refuses memory growth on a "
        "GPU given a memory limit (a logical device configuration); pass one of them",
    )
    require(
        not (r.cudnn_autotune == "on" and deterministic),
        "--cudnn_autotune=on cannot be --deterministic: autotuning picks cuDNN algorithms by timing them, and op "
        "determinism already forces deterministic ones; drop --cudnn_autotune (auto is off under --deterministic)",
    )
    require(
        not (cfg.grappler_options(r.grappler).get("arithmetic_optimization") and deterministic),
        "--grappler=arithmetic_optimization=on cannot be --deterministic: it reorders the fixed-order gradient "
        "sums, so one tower and two differ by an ulp; drop it",
    )
