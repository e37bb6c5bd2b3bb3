"""The figures: which two sides are compared, on which setting, against which target.

Targets are those agreed for `--quick` on a 2-core machine; figures without a target are information.
"""

from __future__ import annotations

from benchmarks.harness.plan import Figure, Setting, Side, Size
from benchmarks.input.figures import FIGURES as INPUT_FIGURES
from trainer.settings.preprocess import resolve_augment

TOWERFLOW = Side("towerflow")
SLOW_FACTOR = 3.0  # async2_vs_sync2_slow_tower: tower 1 takes 3x as long as tower 0 (benchmarks/harness/slow_tower.py)
# Shown for `--only` and in the table; the figure names are the API of this package (JSON keys, tests).
NAMES = (
    "tower1_vs_plain",
    "tower2_vs_mirrored",
    "tower4_vs_mirrored",
    "tower1_vs_keras_fit",
    "tower2_vs_keras_fit_mirrored",
    "tower4_vs_keras_fit_mirrored",
    "tfrecord_vs_memory",
    "deterministic_vs_default",
    "histograms_every_100_vs_none",
    "live_progress_vs_none",
    "async2_vs_sync2",
    "async4_vs_sync4",
    "async2_vs_sync2_slow_tower",
    "xla_vs_default",
    "bf16_vs_fp32",
    "fp16_vs_fp32",
    "onednn_off_vs_on",
    "intra_op_1_vs_default",
    "inter_op_1_vs_default",
    "augment_vs_none",
)
# A task setting's figures (plan.Setting.task): the same model trained by towerflow and by Keras `fit`.
TASK_NAMES = ("lm_tower1_vs_keras_fit", "lm_tower2_vs_keras_fit_mirrored", "lm_tower4_vs_keras_fit_mirrored")
# A peers setting's figures (plan.Setting.peers, issue #45): towerflow against Keras Hub's GPT-2 in `fit` on as
# many devices, and against nanoGPT's model in PyTorch (one process, all cores) at each tower count.
PEER_NAMES = (
    "lm_tower1_vs_keras_hub_fit",
    "lm_tower2_vs_keras_hub_fit_mirrored",
    "lm_tower4_vs_keras_hub_fit_mirrored",
    "lm_tower1_vs_nanogpt_torch",
    "lm_tower2_vs_nanogpt_torch",
    "lm_tower4_vs_nanogpt_torch",
    "lm_tower1_vs_nanogpt_torch_1thread",
)
# Figures also run on the compute-bound setting (full run); the others take too long there: 100-step
# histogram windows of 0.3 s steps, fp16 without CPU kernels, async threads at 4 towers. The runtime and
# augmentation figures run on both: how much a kernel library, a thread pool or a per-image map matters
# depends on how heavy the step is.
HEAVY = ("tower1_vs_plain", "tower2_vs_mirrored", "tower4_vs_mirrored", "tower1_vs_keras_fit",
         "tower2_vs_keras_fit_mirrored", "tower4_vs_keras_fit_mirrored", "tfrecord_vs_memory",
         "deterministic_vs_default", "xla_vs_default", "bf16_vs_fp32", "onednn_off_vs_on",
         "intra_op_1_vs_default", "inter_op_1_vs_default", "augment_vs_none")  # fmt: skip
# How TensorFlow runs on this machine, not how towerflow's code performs: they do not move when towerflow
# changes, so --quick (run after changes) leaves them out unless --only names them (or their group).
RUNTIME = ("onednn_off_vs_on", "intra_op_1_vs_default", "inter_op_1_vs_default")

# The Keras `fit` references' `steps_per_execution`, tuned per setting as a Keras user would: the fastest of the
# values `python -m benchmarks.probes keras_spe` tried (rates in benchmarks/results/keras.md). Keras 3.15 has no "auto".
KERAS_STEPS_PER_EXECUTION = {"cnn-digits": 32, "resnet20-synth": 8, "mlp-digits-b32": 8, "lm-pydoc": 32, "lm-peers": 2}


def keras_fit_figures(setting: Setting, prefix: str = "", target_one: float = 1.0, group: str = "") -> list[Figure]:
    """towerflow against Keras's `model.fit` on 1 device (target `target_one`), and under MirroredStrategy on 2
    and 4 (target 1.0); `prefix` starts each name and `group` is theirs (a task setting's figures)."""
    s = KERAS_STEPS_PER_EXECUTION[setting.name]
    return [
        Figure(f"{prefix}tower1_vs_keras_fit", setting, TOWERFLOW, Side("keras_fit", steps_per_execution=s),
               target=target_one, group=group),
        *[
            Figure(f"{prefix}tower{n}_vs_keras_fit_mirrored", setting, Side("towerflow", n),
                   Side("keras_fit", n, steps_per_execution=s), target=1.0, group=group)
            for n in (2, 4)
        ],
    ]  # fmt: skip


def peer_figures(setting: Setting) -> list[Figure]:
    """`PEER_NAMES`: towerflow at 1, 2 and 4 towers against Keras Hub's GPT-2 in `fit` (target 1.0, as issue #45
    asks) and against nanoGPT in PyTorch (information); group "lm_peers"."""
    s, group = KERAS_STEPS_PER_EXECUTION[setting.name], f"{setting.task}_peers"
    hub = [
        Figure(f"{setting.task}_tower{n}_vs_keras_hub_fit{'_mirrored' if n > 1 else ''}", setting,
               Side("towerflow", n), Side("keras_hub_fit", n, steps_per_execution=s), target=1.0, group=group)
        for n in (1, 2, 4)
    ]  # fmt: skip
    torch = [
        Figure(f"{setting.task}_tower{n}_vs_nanogpt_torch", setting, Side("towerflow", n), Side("nanogpt_torch"),
               group=group)
        for n in (1, 2, 4)
    ]  # fmt: skip
    # PyTorch's two OpenMP threads wait for each other at every op, which costs most when other jobs share the
    # cores; one thread does not wait (benchmarks/results/lm-peers.md).
    one_thread = Figure(f"{setting.task}_tower1_vs_nanogpt_torch_1thread", setting, TOWERFLOW,
                        Side("nanogpt_torch", intra_op_threads=1), group=group)  # fmt: skip
    return hub + torch + [one_thread]


def augment_kind(setting: Setting) -> str:
    """The augmentation `augment_vs_none` times on `setting`: --augment=auto's for its model (the trainer's own
    rule, which imports no TensorFlow). The digits models get none there (a flipped 2 is no 2); here flip, the
    cheapest kind: its cost next to a 20 ms step, not a recommendation."""
    auto = resolve_augment("auto", setting.model, dense=False)
    return "flip" if auto == "none" else auto


def runtime_figures(setting: Setting) -> list[Figure]:
    """oneDNN and thread pools, each against TensorFlow's default in its own worker (process-wide options).

    One intra-op thread: what a run gives up when it shares the machine by taking one core (e.g. two runs on
    2 cores, or data-loading processes next to it). One inter-op thread at 2 towers: the towers' ops, and
    independent ops within a tower, then run one after the other instead of side by side.
    """
    group = "runtime"
    return [
        Figure("onednn_off_vs_on", setting, Side("towerflow", onednn="off"), Side("towerflow", onednn="on"),
               group=group),
        Figure("intra_op_1_vs_default", setting, Side("towerflow", intra_op_threads=1), TOWERFLOW, group=group),
        Figure("inter_op_1_vs_default", setting, Side("towerflow", 2, inter_op_threads=1), Side("towerflow", 2),
               group=group),
    ]  # fmt: skip


def figures(setting: Setting, size: Size) -> list[Figure]:
    """Every figure of `setting`, in the order they run and print. A task setting has only its Keras `fit`
    figures (the other references are written for images and labels); 0.95 at one device, as issue #33 asks."""
    if setting.peers:
        found = peer_figures(setting)
        assert tuple(f.name for f in found) == PEER_NAMES
        return found
    if setting.task:
        found = keras_fit_figures(setting, prefix=f"{setting.task}_", target_one=0.95, group=setting.task)
        assert tuple(f.name for f in found) == TASK_NAMES
        return found
    every = size.histogram_every_steps
    hist_name = "histograms_every_100_vs_none"
    found = [
        Figure("tower1_vs_plain", setting, TOWERFLOW, Side("plain"), target=1.0),
        Figure("tower2_vs_mirrored", setting, Side("towerflow", 2), Side("mirrored", 2), target=1.0),
        Figure("tower4_vs_mirrored", setting, Side("towerflow", 4), Side("mirrored", 4), target=1.0),
        *keras_fit_figures(setting),
        Figure("tfrecord_vs_memory", setting, Side("towerflow", input="tfrecord"), TOWERFLOW, target=0.95),
        # Two towers: the determinism contract is about tower counts, and its ordered sums need two.
        Figure(
            "deterministic_vs_default",
            setting,
            Side("towerflow", 2, deterministic=True),
            Side("towerflow", 2),
            target=0.9,
        ),
        # A window is one histogram period, so each timed window pays for exactly one histogram write.
        Figure(hist_name, setting, Side("towerflow", histogram_every_steps=every), TOWERFLOW, 0.97, fixed_steps=every),
        Figure("live_progress_vs_none", setting, Side("towerflow", live_progress=True), TOWERFLOW, target=0.98),
        *[
            Figure(
                f"async{n}_vs_sync{n}",
                setting,
                Side("towerflow", n, update_mode="async"),
                Side("towerflow", n),
                target=0.95,
                requires="async",
                group="async_vs_sync",
            )
            for n in (2, 4)
        ],
        # What async is for: unequal towers. Sync waits for the slowest tower every step; async does not.
        Figure(
            "async2_vs_sync2_slow_tower",
            setting,
            Side("towerflow", 2, update_mode="async", slow_factor=SLOW_FACTOR),
            Side("towerflow", 2, slow_factor=SLOW_FACTOR),
            target=1.3,
            requires="async",
            group="async_vs_sync",
        ),
        Figure("xla_vs_default", setting, Side("towerflow", jit_compile=True), TOWERFLOW),
        Figure("bf16_vs_fp32", setting, Side("towerflow", mixed_precision="bf16"), TOWERFLOW),
        Figure("fp16_vs_fp32", setting, Side("towerflow", mixed_precision="fp16"), TOWERFLOW),
        *runtime_figures(setting),
        # Both sides read the records (decoded images cached in memory, as --cache=auto does for these sizes).
        Figure(
            "augment_vs_none",
            setting,
            Side("towerflow", input="tfrecord", augment=augment_kind(setting)),
            Side("towerflow", input="tfrecord"),
        ),
    ]
    assert tuple(f.name for f in found) == NAMES
    if setting.data != "digits":
        found = [f for f in found if f.name in HEAVY]
    return found


def select(all_figures: list[Figure], only: list[str], size: Size) -> list[Figure]:
    """The figures named in `only` (a figure's name or group); when `only` is empty, all of them, but for
    the RUNTIME figures when `size` leaves them out.

    Raises:
      ValueError: a name that is no figure or group, listing the valid names.
    """
    if not only:
        return [f for f in all_figures if size.runtime_figures or f.name not in RUNTIME]
    known = set(NAMES) | set(TASK_NAMES) | set(PEER_NAMES) | set(INPUT_FIGURES) | {"input"}
    known |= {f.group for f in all_figures if f.group}
    unknown = [name for name in only if name not in known]
    if unknown:
        raise ValueError(f"--only: unknown figure(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    return [f for f in all_figures if f.name in only or f.group in only]


def select_input(only: list[str]) -> list[str]:
    """The input figures (`benchmarks.input.figures`, group "input") `only` names; all of them when it is empty."""
    return [name for name in INPUT_FIGURES if not only or name in only or "input" in only]
