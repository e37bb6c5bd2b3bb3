"""Rows of the flag table (`trainer.settings.table`) for how a run goes: the loop and its outputs, resume,
several tasks, TensorFlow's runtime."""

from __future__ import annotations

from trainer.settings import config as cfg
from trainer.settings.flag import FREE, Flag, at_least, ints, positive

_OFF = "0 turns it off"
_TF_DEFAULT = "0: TensorFlow's default"


def loop() -> list[Flag]:
    g = "loop and outputs"
    return [
        Flag(
            "model_dir",
            "loop.model_dir",
            g,
            "Checkpoints, events, metrics.json, flags.txt, export/. A rerun with "
            "the same directory resumes from its newest checkpoint.",
            FREE,
            check=lambda v: "" if v else "must not be empty",
        ),
        Flag(
            "train_steps",
            "loop.train_steps",
            g,
            "Total optimizer steps (global batches), counting resumed ones; at least 1.",
            FREE,
            check=at_least(1),
        ),
        Flag(
            "log_every_steps",
            "loop.log_every_steps",
            g,
            "Steps between log lines and train scalars; 0: off.",
            FREE,
            check=at_least(0, _OFF),
        ),
        Flag(
            "eval_every_steps",
            "loop.eval_every_steps",
            g,
            "Steps between evaluations (also one at the end); 0: end only.",
            FREE,
            check=at_least(0, _OFF),
        ),
        Flag(
            "checkpoint_every_steps",
            "loop.checkpoint_every_steps",
            g,
            "Steps between checkpoints (also one at the end); 0: end only.",
            FREE,
            check=at_least(0, _OFF),
        ),
        Flag(
            "histogram_every_steps",
            "loop.histogram_every_steps",
            g,
            "Steps between gradient and weight histograms; 0: off. Each one costs about one extra step time.",
            FREE,
            check=at_least(0, _OFF),
        ),
        Flag(
            "profile_steps",
            "loop.profile_steps",
            g,
            "A,B: record a TensorFlow profiler trace of steps A+1..B into "
            "model_dir/train (TensorBoard's Profile tab, with tensorboard-plugin-profile).",
            FREE,
            parse=ints(2, "two steps A,B"),
        ),
        Flag(
            "steps_per_call",
            "loop.steps_per_call",
            g,
            "Sync: steps per tf.function call, run in an in-graph loop "
            "(same bits for any value; a stop signal still ends the run after the step in progress); 0: auto, calls "
            "of ~0.5 s.",
            FREE,
            check=at_least(0, "0: auto"),
        ),
        Flag(
            "keep_checkpoints",
            "loop.keep_checkpoints",
            g,
            "Newest checkpoints kept, at least 1.",
            FREE,
            check=at_least(1),
        ),
        Flag(
            "max_requeues",
            "loop.max_requeues",
            g,
            "Under Slurm: on SIGUSR1/SIGUSR2 (the time-limit warning, sbatch --signal=B:USR1@T) the run "
            "checkpoints and requeues its job with `scontrol requeue`: always after an attempt that trained steps, "
            "at most this many times in a row after attempts that trained none (warned while starting). Preemption "
            "(SIGTERM) requeues are Slurm's own (--requeue) and not counted.",
            FREE,
            check=at_least(0, "0: no requeue after an attempt that trained no step"),
        ),
        Flag(
            "export",
            "loop.export",
            g,
            "At the end, export a SavedModel to model_dir/export/<step>/ (kept if it exists; README: Serving).",
            FREE,
        ),
        Flag("allow_flag_changes", "loop.allow_flag_changes", "resume", "(generated: table.help_text)", FREE),
    ]


def cluster_and_runtime() -> list[Flag]:
    g = "runtime"
    return [
        Flag(
            "cluster_port",
            "cluster.port",
            "cluster",
            "Several tasks (srun, TF_CONFIG): the gRPC port of the first "
            "task on each node, the next ones using the following ports. 0: derived from SLURM_JOB_ID (12000 + 8 * "
            "(id % 2500)), so two jobs sharing a node do not collide. TF_CONFIG gives its own ports.",
            FREE,
        ),
        Flag(
            "cluster_timeout_sec",
            "cluster.timeout_sec",
            "cluster",
            "Several tasks: seconds the chief waits for "
            "every worker's server, and a worker for the chief, before failing.",
            FREE,
            check=positive,
        ),
        Flag(
            "peer_timeout_sec",
            "cluster.peer_timeout_sec",
            "cluster",
            "Several tasks, once running: seconds any task rides out a peer that does not answer (a network "
            "outage, a frozen process) before ending the attempt with 75 and naming it; a shorter outage costs "
            "only its duration. A peer whose process is gone ends it within seconds.",
            FREE,
            check=positive,
        ),
        Flag(
            "onednn",
            "runtime.onednn",
            g,
            "CPU: oneDNN kernels (TF_ENABLE_ONEDNN_OPTS, set before TensorFlow "
            "loads). auto: TensorFlow's default (on for x86 builds). Their different rounding changes the loss in "
            "the last digits, not the training.",
            FREE,
            cfg.SWITCHES,
        ),
        Flag(
            "inter_op_threads",
            "runtime.inter_op_threads",
            g,
            "Threads running independent ops in parallel; 0: TensorFlow's default.",
            FREE,
            check=at_least(0, _TF_DEFAULT),
        ),
        Flag(
            "intra_op_threads",
            "runtime.intra_op_threads",
            g,
            "Threads inside one op (matmul, conv); 0: TensorFlow's default.",
            FREE,
            check=at_least(0, _TF_DEFAULT),
        ),
        Flag(
            "gpu_memory_growth",
            "runtime.gpu_memory_growth",
            g,
            "Allocate GPU memory as needed instead of all at start (shared GPUs). GPU only.",
            FREE,
        ),
        Flag(
            "gpu_memory_limit_mb",
            "runtime.gpu_memory_limit_mb",
            g,
            "Cap each GPU at this many MiB (not with --gpu_memory_growth); 0: none. GPU only.",
            FREE,
            check=at_least(0, _TF_DEFAULT),
        ),
        Flag(
            "device_memory_mb",
            "runtime.device_memory_mb",
            g,
            "Refuse, before the first step, a run whose step needs more than this many MiB on any one device: "
            "the variables, optimizer slots and gradients placed there plus the activations kept for the backward "
            "pass times the micro-batches in flight there, counted from the traced step. 0: no check. Any device "
            "kind (with GPUs, as --gpu_memory_limit_mb); docs/pipelines.md.",
            FREE,
            check=at_least(0),
        ),
        Flag(
            "cudnn_autotune",
            "runtime.cudnn_autotune",
            g,
            "Time cuDNN's algorithms and keep the fastest "
            "(TF_CUDNN_USE_AUTOTUNE). auto: off under --deterministic (op determinism already forces deterministic "
            "algorithms; on is refused there), else TensorFlow's default.",
            FREE,
            cfg.SWITCHES,
        ),
        Flag(
            "grappler",
            "runtime.grappler",
            g,
            "Graph-rewrite passes NAME=on|off,..., e.g. "
            "layout_optimizer=off,remapping=off (tf.config.optimizer.set_experimental_options); empty: TensorFlow's "
            "defaults.",
            FREE,
            check=lambda v: cfg.grappler_options(v) and "",
        ),
    ]
