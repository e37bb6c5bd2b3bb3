"""The input figures: towerflow's JPEG pipelines against bare `tf.io.decode_jpeg`, per core, in alternating windows.

    input_none_vs_decode      (b) --augment=none, 500x375 JPEG -> 224x224 / (a) decode_jpeg alone  target 0.9
    input_imagenet_vs_decode  (c) --augment=imagenet, 224x224       / (a) decode_jpeg alone  target 1.0

Each side is one `benchmarks.input.pipelines` pipeline limited to one thread; a window is one epoch of the
records, timed in CPU-seconds of this process, and windows alternate (A, B, A, B, ...) after a warm-up epoch
of each, so a change in load hits both sides. Every window ends when the pipelines are idle again (their
prefetch buffers full), so one side's background work is never counted in the other's window. Rate = images
per CPU-second; ratio = median(A) / median(B).
`python -m benchmarks --input` writes these records in its JSON's `figures` list; `python -m benchmarks`
(quick, full, smoke) runs them after the training figures, in the same record format (`runner.result`).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from benchmarks.harness import load, timing

# name -> (towerflow pipeline, target); the reference side is always input_pipelines' "decode", (a)
FIGURES = {
    "input_none_vs_decode": ("towerflow_none", 0.9),
    "input_imagenet_vs_decode": ("towerflow_imagenet", 1.0),
}
REFERENCE = "decode"
# Untimed windows per side after the warm-up: a buffer of 1 batch doubled 5 times holds a full-size window.
WARMUP_WINDOWS = 6
SETTING = "input-jpeg"
SETTING_TEXT = "input pipeline alone, 500x375 JPEG records -> 224x224, batch {batch}, one thread (images per CPU-s)"


def cpu_window(dataset, batch_size: int) -> timing.Window:
    """`window(batches) -> (CPU-seconds, images)` over a one-thread pipeline's iterator.

    The pipelines prefetch: between its windows a side's background thread fills its buffers, and would do
    so in the other side's window, which is timed in CPU-seconds of this same process. So every window starts
    and ends with every pipeline idle (its buffers full): its CPU time is then the work of its batches alone.
    """
    iterator = iter(dataset)

    def window(batches: int) -> tuple[float, int]:
        started = time.process_time()
        for _ in range(batches):
            next(iterator)
        until_idle()
        return max(time.process_time() - started, 1e-9), batches * batch_size

    return window


def warm_windows(datasets: dict, size) -> dict:
    """A `cpu_window` per dataset, after `size.warmup_batches` and WARMUP_WINDOWS untimed windows each, in turns.

    Each window drains a pipeline's prefetch buffer, which then doubles its size (tf.data's prefetch autotuner)
    and refills it, counted in that window, until the buffer holds a whole window: the untimed windows.
    """
    windows = {name: cpu_window(dataset, size.batch_size) for name, dataset in datasets.items()}
    for window in windows.values():
        window(size.warmup_batches)
    for _ in range(WARMUP_WINDOWS):
        for window in windows.values():
            window(size.batches_per_window)
    return windows


def until_idle(poll_sec: float = 0.05, busy: float = 0.05) -> None:
    """Returns once this process used less than `busy` of a core over `poll_sec`: its pipelines' buffers full."""
    last = time.process_time()
    while True:
        time.sleep(poll_sec)
        now = time.process_time()
        if now - last < busy * poll_sec:
            return
        last = now


def measure(size, pattern: str, encoded) -> list[dict]:
    """Both figures over the records of `pattern` (and their bytes `encoded`), with `size` an InputSize."""
    from benchmarks.input import pipelines

    names = [REFERENCE, *(pipeline for pipeline, _ in FIGURES.values())]
    datasets = {name: pipelines.build(name, pattern, encoded, size.batch_size, True) for name in names}
    windows = warm_windows(datasets, size)
    records = []
    for figure, (pipeline, target) in FIGURES.items():
        started, loads = time.perf_counter(), {"a": [], "b": []}  # the machine's load per window (load.py)
        timed = [load.watched(windows[name], loads[key], lambda: [os.getpid()]) for key, name in
                 (("a", pipeline), ("b", REFERENCE))]  # fmt: skip
        comparison = timing.alternate(*timed, size.batches_per_window, size.windows)
        labels = (pipelines.PIPELINES[pipeline][0], pipelines.PIPELINES[REFERENCE][0])
        records.append(record(figure, target, labels, comparison, size, time.perf_counter() - started, loads))
    return records


def record(name: str, target: float, labels, comparison: timing.Comparison, size, seconds: float, loads) -> dict:
    """The figure's record, with the keys of a training figure's (`benchmarks.harness.runner.result`) and its
    windows' `loads` ({"a": [...], "b": [...]}, load.window_load)."""
    q25, q75 = comparison.pair_ratio_quartiles()
    ratio = comparison.ratio
    sides = {}
    for key, label, rates in (("a", labels[0], comparison.a_rates), ("b", labels[1], comparison.b_rates)):
        sides[key] = {"label": label, "median_examples_per_sec": statistics.median(rates), "examples_per_sec": rates}
        sides[key]["load"] = loads[key]
    return {
        "name": name,
        "group": "input",
        "setting": SETTING,
        "setting_text": SETTING_TEXT.format(batch=size.batch_size),
        "status": "ok",
        "target": target,
        **sides,
        "ratio": ratio,
        "passed": ratio >= target,
        "windows": len(comparison.a_rates),
        "steps_per_window": size.batches_per_window,
        "pair_ratios": comparison.pair_ratios,
        "pair_ratio_iqr": [q25, q75],
        "seconds": seconds,
        "load": load.summary(loads["a"] + loads["b"]),
    }


def run(size_name: str) -> list[dict]:
    """Both figures at `jpegs.SIZES[size_name]`, on JPEGs written to a temporary directory."""
    from benchmarks.input import jpegs, pipelines

    size = jpegs.SIZES[size_name]
    with tempfile.TemporaryDirectory(prefix="towerflow-input-figures-") as work_dir:
        pattern = jpegs.write_jpegs(work_dir, size.num_records)
        return measure(size, pattern, pipelines.load_encoded(pattern))
