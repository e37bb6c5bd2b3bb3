"""What a benchmark run measures: workloads (settings), the two sides of a figure, and run sizes.

Plain frozen dataclasses without TensorFlow: the parent process builds them, and sends sides to workers
as JSON (`dataclasses.asdict`), which rebuild them with `Side(**fields)`.
"""

from __future__ import annotations

import dataclasses
import typing


@dataclasses.dataclass(frozen=True)
class Setting:
    """One workload: a model, its data and the global batch, the same for both sides of every figure."""

    name: str
    model: str
    example_shape: tuple[int, ...]
    num_classes: int
    global_batch_size: int
    # "digits" (the built-in 8x8 digits), "synthetic" (data.prepare synthetic, cached), "pydoc" (the default text
    # corpus in char tokens) or "pydoc-subword4000" (in 4000 subword tokens; records.TEXT_TOKENS)
    data: str
    num_examples: int  # train examples (synthetic only; the digits have 1437)
    # A built-in task (tasks.BUILT_IN) other than classification: its sides are benchmarks/harness/lm.py's, its
    # example_shape is (context + 1,) tokens and num_classes is unused (the vocabulary is the records').
    task: str = ""
    width: int = 0  # a task setting's model width (--lm_width); 0: the task's default
    # A task setting measured against the models users pick instead (benchmarks/harness/peers.py): Keras Hub's GPT-2
    # in `fit` and nanoGPT's model in PyTorch, rather than Keras `fit` of towerflow's own model.
    peers: bool = False

    def describe(self) -> str:
        shape = "x".join(str(d) for d in self.example_shape)
        return f"{self.model}, {shape} {self.data}, global batch {self.global_batch_size}"


SETTINGS = {
    # The project's default workload. 8x8 images, but 128 of them through two 3x3 convs (32 and 64 filters)
    # is ~20 ms of compute per step on 2 cores, so per-step dispatch overhead is a few percent, not all.
    "cnn-digits": Setting("cnn-digits", "cnn", (8, 8, 1), 10, 128, "digits", 1437),
    # Compute-bound: ~0.3 s per step on 2 cores, per-step overhead is noise; shows what the towers cost.
    "resnet20-synth": Setting("resnet20-synth", "resnet20", (32, 32, 3), 10, 64, "synthetic", 2048),
    # For --smoke, which checks that every figure runs: the mlp traces in half the time of the cnn.
    "mlp-digits-b32": Setting("mlp-digits-b32", "mlp", (8, 8, 1), 10, 32, "digits", 1437),
    # The language model (tasks/lm.py, default sizes: 4 blocks of width 128, 0.83 M parameters) on the default
    # corpus's windows of 65 chars (data.text.ensure_default_lm_data): 32 x 64 target tokens per step, ~0.1 s
    # on 2 cores, 8 sequences per tower at 4 towers.
    "lm-pydoc": Setting("lm-pydoc", "transformer_lm", (65,), 0, 32, "pydoc", 6541, task="lm"),
    # A small GPT against its peers (issue #45): 4 blocks of width 256, 4 heads, context 128, 4000 subword tokens
    # (3.2 M weights in the blocks, 1.0 M in the embedding): 16 x 128 target tokens per step, ~0.5 s on 2 cores.
    "lm-peers": Setting("lm-peers", "transformer_lm", (129,), 0, 16, "pydoc-subword4000", 512, "lm", 256, True),
}


class SessionKey(typing.NamedTuple):
    """What is process-wide in TensorFlow, so sides differing in it need their own worker process: the logical
    device count and the runtime options (fixed before the first op, oneDNN before the import), and op
    determinism (kernels read it when they run, so it would leak into a default side of the same process)."""

    devices: int
    deterministic: bool = False
    onednn: str = "auto"
    inter_op_threads: int = 0
    intra_op_threads: int = 0

    def describe(self) -> str:
        """A short name for log files: `2`, `1-deterministic`, `1-onednn_off-intra1`."""
        parts = [str(self.devices)]
        parts += ["deterministic"] if self.deterministic else []
        parts += [f"onednn_{self.onednn}"] if self.onednn != "auto" else []
        parts += [f"inter{self.inter_op_threads}"] if self.inter_op_threads else []
        parts += [f"intra{self.intra_op_threads}"] if self.intra_op_threads else []
        return "-".join(parts)


@dataclasses.dataclass(frozen=True)
class Side:
    """One side of a figure: a training loop and its options, built once per worker and timed in windows.

    kind: "towerflow" (trainer.loop.build.build), "plain" (a single-device tf.function step), "mirrored"
    (tf.distribute.MirroredStrategy custom loop), "keras_fit" (Keras's `model.fit`; under MirroredStrategy
    with more than one device), or a peer of a `Setting.peers` setting: "keras_hub_fit" (Keras Hub's GPT-2 in
    `fit`, as "keras_fit") or "nanogpt_torch" (nanoGPT's model in PyTorch on the CPU, one process).
    """

    kind: str
    towers: int = 1
    input: str = "memory"  # "memory": decoded batches held in memory; "tfrecord": the normal reader
    deterministic: bool = False
    jit_compile: bool = False
    mixed_precision: str = ""
    update_mode: str = "sync"
    histogram_every_steps: int = 0  # >0: every window ends with gradient+weight histograms
    live_progress: bool = False  # redraw the console's live line (trainer.outputs.progress), into /dev/null
    augment: str = "none"  # --augment of a "tfrecord" side (memory sides hold unaugmented batches)
    slow_factor: float = 0.0  # > 1: the last tower takes this x as long (benchmarks/harness/slow_tower.py)
    # Runtime options (trainer.system.runtime); process-wide, so part of `session_key`. auto / 0: TensorFlow's default.
    onednn: str = "auto"
    inter_op_threads: int = 0
    intra_op_threads: int = 0
    steps_per_execution: int = 1  # a "keras_fit" side's `compile(steps_per_execution=...)`
    keras_accuracy: bool = True  # a "keras_fit" side's `compile(metrics=["accuracy"])`, as towerflow reports it

    def __post_init__(self):
        if self.augment != "none" and self.input != "tfrecord":
            raise ValueError(f"augment={self.augment!r} needs input='tfrecord': memory batches are not augmented")

    def label(self) -> str:
        if self.kind != "towerflow":
            execution = ""
            if self.kind in ("keras_fit", "keras_hub_fit"):
                execution = f", steps_per_execution={self.steps_per_execution}"
                execution += ", loss and accuracy" if self.keras_accuracy else ", loss only"
            if self.intra_op_threads:
                execution += f", {self.intra_op_threads} intra-op thread(s)"
            return f"{self.kind} ({self.towers} device{'s' if self.towers > 1 else ''}{execution})"
        options = [f"{self.towers} tower{'s' if self.towers > 1 else ''}", self.input]
        options += [self.update_mode] if self.update_mode != "sync" else []
        options += ["deterministic"] if self.deterministic else []
        options += ["xla"] if self.jit_compile else []
        options += [self.mixed_precision] if self.mixed_precision else []
        options += [f"histograms/{self.histogram_every_steps}"] if self.histogram_every_steps else []
        options += ["live progress line"] if self.live_progress else []
        options += [f"--augment={self.augment}"] if self.augment != "none" else []
        options += [f"tower {self.towers - 1} slowed {self.slow_factor:g}x"] if self.slow_factor > 1 else []
        options += [f"oneDNN {self.onednn}"] if self.onednn != "auto" else []
        options += [f"{self.inter_op_threads} inter-op thread(s)"] if self.inter_op_threads else []
        options += [f"{self.intra_op_threads} intra-op thread(s)"] if self.intra_op_threads else []
        return "towerflow " + ", ".join(options)

    @property
    def session_key(self) -> SessionKey:
        """The process-wide state of the worker this side is built in."""
        return SessionKey(self.towers, self.deterministic, self.onednn, self.inter_op_threads, self.intra_op_threads)


@dataclasses.dataclass(frozen=True)
class Figure:
    """towerflow (side `a`) against a reference (side `b`): ratio = median(a) / median(b) in examples/sec."""

    name: str
    setting: Setting
    a: Side
    b: Side
    target: float | None = None
    fixed_steps: int = 0  # >0: every window has exactly this many steps (instead of calibrating to seconds)
    requires: str = ""  # "async": measured only when trainer.settings.config.UPDATE_MODES has it
    group: str = ""  # a name `--only` also accepts, shared by related figures

    @property
    def key(self) -> str:
        return f"{self.name}@{self.setting.name}"


@dataclasses.dataclass(frozen=True)
class Size:
    """How long a run measures: timed windows per side, warm-up, and the seconds a window aims at."""

    name: str
    windows: int
    warmup_windows: int
    window_sec: float  # 0: every window has `min_steps` steps
    min_steps: int
    histogram_every_steps: int
    settings: tuple[str, ...]
    runtime_figures: bool = True  # False: figures.RUNTIME only when --only names them


SIZES = {
    "smoke": Size("smoke", windows=3, warmup_windows=0, window_sec=0.0, min_steps=2, histogram_every_steps=2,
                  settings=("mlp-digits-b32",)),
    "quick": Size("quick", windows=7, warmup_windows=1, window_sec=0.6, min_steps=2, histogram_every_steps=100,
                  settings=("cnn-digits",), runtime_figures=False),
    "full": Size("full", windows=11, warmup_windows=1, window_sec=1.0, min_steps=2, histogram_every_steps=100,
                 settings=("cnn-digits", "resnet20-synth")),
}  # fmt: skip
