"""The benchmark harness and the headline table: the timing helpers, the figures, the workers, and `python -m
benchmarks --smoke` and `--input --smoke` end to end (every figure present, its numbers consistent with its
windows; how fast a side is, this noisy machine cannot say). The probes and machines: test_benchmark_probes.py."""

import json
import math
import os
import statistics
import subprocess
import sys

import pytest

from benchmarks import figures
from benchmarks.harness import runner, session, timing
from benchmarks.harness.plan import SETTINGS, SIZES, Figure, SessionKey, Side
from tests.support.paths import ROOT as REPO_ROOT
from trainer.settings import config
from trainer.system import runtime


def test_alternate_runs_a_then_b_and_takes_the_ratio_of_medians():
    calls = []

    def window(name, seconds):
        def run(steps):
            calls.append((name, steps))
            return seconds.pop(0), 100 * steps

        return run

    comparison = timing.alternate(window("a", [1.0, 2.0, 1.0]), window("b", [2.0, 2.0, 4.0]), steps=5, windows=3)
    assert calls == [("a", 5), ("b", 5)] * 3
    assert comparison.a_rates == [500.0, 250.0, 500.0]
    assert comparison.ratio == pytest.approx(500.0 / 250.0)
    assert comparison.pair_ratios == [2.0, 1.0, 4.0]


def test_calibrate_aims_at_the_window_length_within_bounds():
    assert timing.calibrate(0.02, 0.6, min_steps=2) == 30
    assert timing.calibrate(5.0, 0.6, min_steps=2) == 2
    assert timing.calibrate(1e-6, 0.6, min_steps=2, max_steps=100) == 100
    assert timing.calibrate(0.02, 0.0, min_steps=3) == 3


def test_windows_are_calibrated_on_the_steps_a_side_ran_in_whole_keras_executions():
    """A Keras fit side runs whole executions (32 steps when asked for 2): its per-step time is its seconds over
    the steps it ran, and windows are whole executions, so both sides run the same steps."""
    keras_side = Side("keras_fit", steps_per_execution=32)
    figure = Figure("tower1_vs_keras_fit", SETTINGS["cnn-digits"], Side("towerflow"), keras_side)

    def towerflow(steps):
        return 0.01 * steps, 128 * steps

    def keras(steps):
        ran = -(-steps // 32) * 32
        return 0.01 * ran, 128 * ran

    assert runner.warm_up(figure, SIZES["quick"], towerflow, keras) == 64  # 0.6 s of 10 ms steps: 60 -> 64


def test_only_accepts_figure_names_and_groups():
    setting, size = SETTINGS["cnn-digits"], SIZES["quick"]
    all_figures = figures.figures(setting, size)
    assert [f.name for f in figures.select(all_figures, ["async_vs_sync"], size)] == [
        "async2_vs_sync2",
        "async4_vs_sync4",
        "async2_vs_sync2_slow_tower",
    ]
    with pytest.raises(ValueError, match="unknown figure"):
        figures.select(all_figures, ["tower3_vs_plain"], size)


def test_a_slowed_tower_sleeps_once_per_micro_batch_of_that_tower(make_config, monkeypatch):
    from benchmarks.harness import slow_tower
    from trainer.loop.build import build

    trainer = build(make_config(towers={"micro_batches": 4}))  # sync: 2 micro-batches per tower per step
    slow_tower.install(trainer.updater, 1, 1.5)
    slept = []
    monkeypatch.setattr(slow_tower.time, "sleep", slept.append)
    trainer.updater.train_steps(3)
    assert len(slept) == 3 * 2 and all(seconds > 0 for seconds in slept)


def test_a_slowed_tower_changes_no_bit(make_config):
    from benchmarks.harness import slow_tower
    from trainer.loop.build import build
    from trainer.outputs import report

    def trained(factor: float) -> str:
        trainer = build(make_config())  # sync, deterministic, 2 towers
        if factor:
            slow_tower.install(trainer.updater, 1, factor)
        trainer.updater.train_steps(4)
        return report.weights_sha256(trainer.model.variables)

    assert trained(0.0) == trained(1.5)


def test_quick_leaves_the_runtime_figures_out_unless_named():
    setting, quick = SETTINGS["cnn-digits"], SIZES["quick"]
    all_figures = figures.figures(setting, quick)
    default = [f.name for f in figures.select(all_figures, [], quick)]
    assert "augment_vs_none" in default and not set(figures.RUNTIME) & set(default)
    assert [f.name for f in figures.select(all_figures, ["runtime"], quick)] == list(figures.RUNTIME)
    full = SIZES["full"]
    for name in full.settings:
        selected = [f.name for f in figures.select(figures.figures(SETTINGS[name], full), [], full)]
        assert {*figures.RUNTIME, "augment_vs_none"} <= set(selected), name


def test_runtime_options_are_part_of_the_session_key_and_the_worker_command():
    side = Side("towerflow", 2, onednn="off", inter_op_threads=1, intra_op_threads=3)
    assert side.session_key == SessionKey(2, False, "off", 1, 3) != Side("towerflow", 2).session_key
    assert side.session_key.describe() == "2-onednn_off-inter1-intra3"
    command = session.worker_command(side.session_key)
    assert {"--devices=2", "--onednn=off", "--inter_op_threads=1", "--intra_op_threads=3"} <= set(command)
    assert "--deterministic" not in command
    assert Side("towerflow", augment="flip", input="tfrecord").session_key == Side("towerflow").session_key


def test_augment_needs_tfrecord_input_and_matches_the_trainers_auto():
    with pytest.raises(ValueError, match="needs input='tfrecord'"):
        Side("towerflow", augment="flip")
    assert figures.augment_kind(SETTINGS["resnet20-synth"]) == "crop_flip"
    assert figures.augment_kind(SETTINGS["cnn-digits"]) == "flip"  # auto gives none: flip is timed as a cost


def test_worker_applies_and_reads_back_its_runtime_options():
    key = SessionKey(1, False, onednn="off", inter_op_threads=2, intra_op_threads=1)
    env = {k: v for k, v in os.environ.items() if k != runtime.ONEDNN_ENV}  # as another test may leave it
    worker = subprocess.Popen(
        session.worker_command(key), cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        info = json.loads(worker.stdout.readline())
    finally:
        worker.stdin.close()
        worker.wait(timeout=60)
    assert info["ok"] and worker.returncode == 0
    applied = info["runtime"]
    assert applied["inter_op_threads"] == 2 and applied["intra_op_threads"] == 1
    assert applied[runtime.ONEDNN_ENV] == "0" and applied["onednn_enabled"] is False


def test_worker_refuses_a_runtime_setting_tensorflow_does_not_report():
    from benchmarks.harness import worker

    with pytest.raises(RuntimeError, match="not in force.*intra_op_threads"):
        worker.applied_runtime(config.RuntimeConfig(intra_op_threads=97))


@pytest.mark.parametrize("devices", [1, 2])
def test_keras_fit_side_is_one_fit_held_between_windows_of_whole_executions(devices):
    """The `model.fit` reference (MirroredStrategy with 2 devices) runs whole executions of steps_per_execution
    steps per window, in one `fit` call that waits between windows, so no window pays `fit`'s start-up."""
    import tensorflow as tf

    from benchmarks.harness import reference

    setting = SETTINGS["mlp-digits-b32"]
    batch = setting.global_batch_size
    features = tf.zeros([4, batch, *setting.example_shape])
    dataset = tf.data.Dataset.from_tensor_slices((features, tf.zeros([4, batch], tf.int64))).repeat()
    side = reference.KerasFitSide(setting, dataset, devices, steps_per_execution=4, accuracy=True)
    try:
        assert [side.window(steps)[1] for steps in (5, 4, 1)] == [8 * batch, 4 * batch, 4 * batch]
        assert int(side.model.optimizer.iterations.numpy()) == 16
        assert side.thread.is_alive()
    finally:
        side.close()
    assert not side.thread.is_alive()
    assert side.model.metrics_names == ["loss", "compile_metrics"]
    label = Side("keras_fit", 2, steps_per_execution=4, keras_accuracy=False).label()
    assert label == "keras_fit (2 devices, steps_per_execution=4, loss only)"


def _check_measured(record: dict, windows: int, steps: int) -> None:
    """The record's numbers hold together: its ratio is the ratio of its sides' medians, its pair ratios those
    of its windows, and it passed exactly when its ratio reached its target."""
    assert record["windows"] == windows and record["steps_per_window"] == steps
    medians = []
    for side in ("a", "b"):
        rates = record[side]["examples_per_sec"]
        assert len(rates) == windows and all(math.isfinite(r) and r > 0 for r in rates)
        assert record[side]["median_examples_per_sec"] == statistics.median(rates)
        medians.append(statistics.median(rates))
    assert record["ratio"] == pytest.approx(medians[0] / medians[1], rel=1e-12)
    pairs = [a / b for a, b in zip(record["a"]["examples_per_sec"], record["b"]["examples_per_sec"], strict=True)]
    assert record["pair_ratios"] == pytest.approx(pairs, rel=1e-12)
    assert min(pairs) <= record["pair_ratio_iqr"][0] <= record["pair_ratio_iqr"][1] <= max(pairs)
    assert record["passed"] == (None if record["target"] is None else record["ratio"] >= record["target"])
    _check_load(record, windows)


def _check_load(record: dict, windows: int) -> None:
    """Each timed window's load, read from /proc beside it (benchmarks/harness/load.py), and the figure's summary."""
    cpus = os.cpu_count()
    for side in ("a", "b"):
        loads = record[side]["load"]
        assert len(loads) == windows
        for window in loads:
            assert window["cpus_start"] == window["cpus_end"] == cpus
            assert window["load_average_start"] >= 0 and window["load_average_end"] >= 0
            assert window["other_cpus"] is None or 0 <= window["other_cpus"] <= cpus
    starts = [w["load_average_start"] for side in ("a", "b") for w in record[side]["load"]]
    assert record["load"]["load_average_start_max"] == max(starts) and record["load"]["cpus"] == cpus


def test_smoke_run_writes_every_figure(tmp_path):
    """Every training figure; the input figures, which a --smoke run adds last, are the input smoke run's below
    (the same function: each took ~25 CPU-s of JPEG writing and timing)."""
    out = tmp_path / "smoke.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--only", ",".join(figures.NAMES), "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = json.loads(out.read_text())
    size = SIZES["smoke"]
    assert run["size"]["windows"] == size.windows
    for key in ("date", "nproc", "cpu_model", "tensorflow", "keras", "python", "command", "load_average_start"):
        assert run["environment"][key] not in (None, "", "unknown"), key
    by_name = {record["name"]: record for record in run["figures"]}
    assert list(by_name) == list(figures.NAMES)
    async_available = "async" in config.UPDATE_MODES
    for name, record in by_name.items():
        assert record["setting"] == size.settings[0]
        if name.startswith("async") and not async_available:
            assert record["status"] == "not available" and record["ratio"] is None
            continue
        assert record["status"] == "ok", record.get("error")
        steps = size.histogram_every_steps if name.startswith("histograms") else size.min_steps
        _check_measured(record, size.windows, steps)
    _check_runtime_read_back(by_name)


def _check_input_figures(records: list[dict], stdout: str) -> None:
    """The input figures (benchmarks/input_figures.py) at smoke size: values present, targets, rows printed."""
    from benchmarks.input import jpegs

    size = jpegs.SIZES["smoke"]
    assert [(r["name"], r["target"]) for r in records] == [
        ("input_none_vs_decode", 0.9),
        ("input_imagenet_vs_decode", 1.0),
    ]
    for record in records:
        assert record["status"] == "ok" and record["setting"] == "input-jpeg"
        _check_measured(record, size.windows, size.batches_per_window)
        assert record["b"]["label"] == "(a) decode_jpeg alone" and record["a"]["label"].startswith(("(b)", "(c)"))
        assert record["name"] in stdout


def test_input_figures_are_selected_by_name_or_group():
    assert figures.select_input([]) == list(figures.INPUT_FIGURES)
    assert figures.select_input(["input"]) == list(figures.INPUT_FIGURES)
    assert figures.select_input(["input_imagenet_vs_decode"]) == ["input_imagenet_vs_decode"]
    assert figures.select_input(["tower1_vs_plain"]) == []
    every = [f for name in SIZES["full"].settings for f in figures.figures(SETTINGS[name], SIZES["full"])]
    assert figures.select(every, ["input_none_vs_decode"], SIZES["full"]) == []  # no training figure, no error


def _check_runtime_read_back(by_name: dict) -> None:
    """Each side of a runtime figure ran with what its label says, as its worker's TensorFlow reports it."""
    onednn = by_name["onednn_off_vs_on"]
    assert (onednn["a"]["runtime"]["onednn_enabled"], onednn["b"]["runtime"]["onednn_enabled"]) == (False, True)
    intra, inter = by_name["intra_op_1_vs_default"], by_name["inter_op_1_vs_default"]
    assert (intra["a"]["runtime"]["intra_op_threads"], intra["b"]["runtime"]["intra_op_threads"]) == (1, 0)
    assert (inter["a"]["runtime"]["inter_op_threads"], inter["b"]["runtime"]["inter_op_threads"]) == (1, 0)
    assert "--augment=flip" in by_name["augment_vs_none"]["a"]["label"]
    assert "augment" not in by_name["augment_vs_none"]["b"]["label"]


def test_input_smoke_run_prints_every_pipeline_with_positive_rates(tmp_path):
    from benchmarks.input import pipelines as input_pipelines

    out = tmp_path / "input.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--input", "--smoke", "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,  # 18 s alone; minutes on a loaded 2-core machine
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = json.loads(out.read_text())
    assert [row["name"] for row in run["pipelines"]] == list(input_pipelines.PIPELINES)
    _check_input_figures(run["figures"], done.stdout)
    for row in run["pipelines"]:
        assert row["label"] in done.stdout
        for cores in ("one_core", "all_cores"):
            rates = row[cores]["images_per_sec"]
            assert rates and all(math.isfinite(r) and r > 0 for r in rates), (row["name"], cores)
    assert run["pipelines"][0]["mean_jpeg_bytes"] > 10_000  # 500x375 photo-like JPEGs, not a few bytes
    assert [need["cores_per_gpu"] > 0 for need in run["gpu_needs"]] == [True, True]
    assert "cores of (c)" in done.stdout
    assert [row["name"] for row in run["small_pipelines"]] == list(input_pipelines.SMALL_PIPELINES)
    costs = run["augmentation_costs"]
    assert [(c["augment"], c["pipeline"].split(",")[0]) for c in costs] == [
        ("imagenet", "500x375 JPEG files -> 224x224 (none: resize whole)"),
        ("flip", "32x32 PNG records"),
        ("crop_flip", "32x32 PNG records"),
        ("crop_flip", "32x32 PNG records"),
    ]
    for cost in costs:  # the difference of two positive per-image costs, and its share of the first
        assert cost["us_per_image"] > 0 and cost["us_per_image_none"] > 0
        assert cost["cost_us_per_image"] == pytest.approx(cost["us_per_image"] - cost["us_per_image_none"])
        assert cost["share_of_pipeline"] == pytest.approx(cost["cost_us_per_image"] / cost["us_per_image"])
        assert f"--augment={cost['augment']} on {cost['pipeline']}" in done.stdout


def test_input_takes_no_training_benchmark_options():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--input", "--only", "tower1_vs_plain"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "--input takes only --smoke and --out" in done.stderr
