"""Runs figures: builds both sides in their workers, warms up, then alternates timed windows.

A figure's result is a plain dict (the JSON `figures` entries; see `result`), so a failed or unavailable
figure is reported in the same table as the others instead of ending the run.
"""

from __future__ import annotations

import contextlib
import os
import time

from benchmarks.harness import load, timing, trust
from benchmarks.harness.plan import Figure, Size
from benchmarks.harness.session import Session, Sessions, WorkerError


def _window(session: Session, side_id: str) -> timing.Window:
    def run(steps: int) -> tuple[float, int]:
        reply = session.call("window", side_id=side_id, steps=steps)
        return reply["seconds"], reply["examples"]

    return run


def trace_steps(size: Size) -> int:
    """Steps of a side's first window, run when it is built: towerflow traces two step functions, a lean
    one and the reporting last step of a window, so a first window of one step would leave one untraced."""
    return max(2, size.min_steps)


def prebuild(figures: list[Figure], sessions: Sessions, records: dict, size: Size) -> None:
    """Builds and traces every side before the first timed window, in all workers at once.

    Tracing is most of a run's fixed cost and is single-threaded Python: workers tracing side by side use
    both cores. Nothing is timed meanwhile. A side that fails here is built again by `measure`, which
    reports the error with its figure.
    """
    pending = []
    for figure in figures:
        for side in (figure.a, figure.b):
            with contextlib.suppress(WorkerError):  # a worker that failed to start: `measure` reports it
                session = sessions.get(side.session_key)
                key = session.send_build(side, figure.setting, records[figure.setting.name], trace_steps(size))
                if key is not None:
                    pending.append((session, key))
    for session, key in pending:
        with contextlib.suppress(WorkerError):
            session.receive_build(key)


def seconds_per_step(windows: tuple[timing.Window, timing.Window], size: Size, batch: int) -> float:
    """The slower side's seconds per step of `batch` examples, from short probe windows.

    Two rounds: `min_steps` per side, then, unless that already takes long (fp16 on CPU: seconds per
    step), about half a window per side; each side keeps its faster round, because the first window after
    a pause or after the other side ran is often slow, and a window calibrated on it would be too short.
    A side may run more steps than asked (Keras `fit` runs whole executions): its examples say how many.
    """

    def probe(window: timing.Window, steps: int) -> float:
        seconds, examples = window(steps)
        return seconds / (examples / batch)

    per_side = [probe(window, size.min_steps) for window in windows]
    steps = timing.calibrate(max(per_side), size.window_sec / 2, size.min_steps)
    if steps > size.min_steps:
        per_side = [min(first, probe(window, steps)) for first, window in zip(per_side, windows, strict=True)]
    return max(per_side)


def warm_up(figure: Figure, size: Size, window_a: timing.Window, window_b: timing.Window) -> int:
    """Picks the steps per window and runs the warm-up windows; returns the steps per window.

    Starts with a short window of each side: building another side in the same worker (seeding, the
    determinism switches) clears TensorFlow's caches of instantiated functions, and the next call of a
    side's step pays ~0.5 s to instantiate it again, which must not reach the calibration.
    """
    windows = (window_a, window_b)
    for window in windows:
        window(size.min_steps)
    if figure.fixed_steps:
        steps = figure.fixed_steps
    elif size.window_sec > 0:
        per_step = seconds_per_step(windows, size, figure.setting.global_batch_size)
        steps = timing.calibrate(per_step, size.window_sec, size.min_steps)
        # whole executions of a Keras fit side, so both sides of a window run the same steps
        execution = max(figure.a.steps_per_execution, figure.b.steps_per_execution)
        steps = -(-steps // execution) * execution
    else:
        steps = size.min_steps
    for _ in range(size.warmup_windows):
        for window in windows:
            window(steps)
    return steps


def measure(figure: Figure, size: Size, sessions: Sessions, records: dict, profile_dir: str = "") -> dict:
    """Times `figure` (both sides in their workers, built on first use) and returns its result."""
    started = time.perf_counter()
    session_a, session_b = sessions.get(figure.a.session_key), sessions.get(figure.b.session_key)
    side_a = session_a.build(figure.a, figure.setting, records, trace_steps(size))
    side_b = session_b.build(figure.b, figure.setting, records, trace_steps(size))
    window_a, window_b = _window(session_a, side_a), _window(session_b, side_b)
    steps = warm_up(figure, size, window_a, window_b)
    loads = {"a": [], "b": []}  # the machine's load over each timed window (load.py)
    watched = [load.watched(w, loads[label], sessions.pids) for w, label in ((window_a, "a"), (window_b, "b"))]
    comparison = timing.alternate(*watched, steps, size.windows)
    if profile_dir:
        for label, session, side_id in (("a", session_a, side_a), ("b", session_b, side_b)):
            log_dir = os.path.join(profile_dir, figure.key.replace("@", "-"), label)
            session.call("profile", side_id=side_id, steps=steps, log_dir=log_dir)
    record = result(figure, "ok", comparison, steps, time.perf_counter() - started)
    record["load"] = load.summary(loads["a"] + loads["b"])
    for label, session, side_id in (("a", session_a, side_a), ("b", session_b, side_b)):
        # as TensorFlow reports it in that worker: the evidence that a runtime figure compared what it says
        record[label]["runtime"] = session.ready().get("runtime")
        record[label]["load"] = loads[label]
        record[label].update({k: v for k, v in session.call("stats", side_id=side_id).items() if k != "ok"})
    return trust.judge(record)  # a language model's figure whose sides had unequal machines is refused


def result(figure: Figure, status: str, comparison=None, steps: int = 0, seconds: float = 0.0, error: str = ""):
    """The JSON record of a figure. `status`: "ok", "not available" (async without an async mode) or
    "error" (`error` holds the worker's traceback); only "ok" records carry numbers ("refused" ones, see
    trust.judge, all but the ratio's)."""
    record = {
        "name": figure.name,
        "group": figure.group or figure.name,
        "setting": figure.setting.name,
        "setting_text": figure.setting.describe(),
        "status": status,
        "target": figure.target,
        "a": {"label": figure.a.label()},
        "b": {"label": figure.b.label()},
    }
    if comparison is None:
        return {**record, "ratio": None, "passed": None, "error": error}
    q25, q75 = comparison.pair_ratio_quartiles()
    ratio = comparison.ratio
    record["a"].update(median_examples_per_sec=comparison.median_a, examples_per_sec=comparison.a_rates)
    record["b"].update(median_examples_per_sec=comparison.median_b, examples_per_sec=comparison.b_rates)
    return {
        **record,
        "ratio": ratio,
        "passed": None if figure.target is None else ratio >= figure.target,
        "windows": len(comparison.a_rates),
        "steps_per_window": steps,
        "pair_ratios": comparison.pair_ratios,
        "pair_ratio_iqr": [q25, q75],
        "seconds": seconds,
    }


def _last_uses(figures: list[Figure]) -> dict[int, list]:
    """Figure index -> the (side, setting) pairs it is the last to use, so they can be freed after it."""
    last = {}
    for i, figure in enumerate(figures):
        for side in (figure.a, figure.b):
            last[(side, figure.setting)] = i
    by_index: dict[int, list] = {}
    for item, i in last.items():
        by_index.setdefault(i, []).append(item)
    return by_index


def runnable(figures: list[Figure], available: set[str]) -> list[Figure]:
    """The figures whose optional feature (`Figure.requires`) this trainer has."""
    return [f for f in figures if not f.requires or f.requires in available]


def start_workers(figures: list[Figure], available: set[str], sessions: Sessions) -> None:
    """Starts the workers the figures need, without waiting: their TensorFlow imports (seconds each)
    overlap with each other and with whatever the caller does next."""
    sessions.start(dict.fromkeys(side.session_key for f in runnable(figures, available) for side in (f.a, f.b)))


def run(figures: list[Figure], size: Size, records: dict, sessions: Sessions, available: set[str], **options):
    """Measures every figure in order; yields each result as soon as it is known (for live printing).

    `available`: the optional features (`Figure.requires`) this trainer has; `options`: see `measure`.
    """
    start_workers(figures, available, sessions)
    runnable_figures = runnable(figures, available)
    prebuild(runnable_figures, sessions, records, size)
    last_uses = _last_uses(runnable_figures)
    for figure in figures:
        if figure not in runnable_figures:
            yield result(figure, "not available")
            continue
        try:
            yield measure(figure, size, sessions, records[figure.setting.name], **options)
        except WorkerError as e:
            yield result(figure, "error", error=str(e))
        for side, setting in last_uses.get(runnable_figures.index(figure), []):
            session = sessions.sessions.get(side.session_key)
            if session is not None:
                with contextlib.suppress(WorkerError):  # a broken worker is replaced when next needed
                    session.drop(side, setting)
