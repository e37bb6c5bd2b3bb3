"""What a user sees in a real TensorBoard server (over HTTP) for two runs, one of them resumed to more steps:
HParams ranks runs by eval accuracy with the run-defining settings resolved, the towers' step times share one
Custom Scalars chart, and the Projector stays off (no checkpoint where TensorBoard looks)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import pytest

from tests.support.runs import cpu_flags, run_trainer

STATUSES = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]


def _trainer(model_dir, learning_rate: float, train_steps: int) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    flags = cpu_flags(
        global_batch_size=64,
        learning_rate=learning_rate,
        train_steps=train_steps,
        log_every_steps=5,
        eval_every_steps=10,
        checkpoint_every_steps=10,
        export=False,
    )
    result = run_trainer(*flags, f"--model_dir={model_dir}", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((model_dir / "metrics.json").read_text())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run_a_at_10(tmp_path_factory):
    """A copy of run_a's model_dir after its first start (lr 0.05, 10 steps), outside the logdir: the run
    test_resume_of_an_old_model_dir_moves_its_checkpoints starts from (one trainer process, not two)."""
    run = tmp_path_factory.mktemp("run_a_at_10") / "run"
    _trainer(run, 0.05, 10)
    return run


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, run_a_at_10):
    """run_a (lr 0.05, 10 steps, then resumed to 20) and run_b (lr 0.1, 10 steps); their metrics.json."""
    root = tmp_path_factory.mktemp("logdir")
    shutil.copytree(run_a_at_10, root / "run_a")
    metrics = {"run_a": _trainer(root / "run_a", 0.05, 20), "run_b": _trainer(root / "run_b", 0.1, 10)}
    return root, metrics


@pytest.fixture(scope="module")
def server(logdir):
    """A TensorBoard on 127.0.0.1 serving the logdir, once it has loaded both runs; its base URL."""
    port = _free_port()
    command = [sys.executable, "-m", "tensorboard.main", f"--logdir={logdir[0]}", f"--port={port}", "--host=127.0.0.1"]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([*command, "--reload_interval=1"], stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 60
            while not _runs_loaded(url):
                assert proc.poll() is None and time.monotonic() < deadline, _tail(log)
                time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _runs_loaded(url: str) -> bool:
    try:
        return {"run_a/eval", "run_b/eval", "run_a", "run_b"} <= set(_get(url, "/data/runs"))
    except OSError:
        return False


def _tail(log) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-3000:]


def _get(url: str, path: str):
    with urllib.request.urlopen(url + path, timeout=30) as response:
        return json.loads(response.read())


def _post(url: str, path: str, body: dict):
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _session_groups(url: str) -> list:
    """As the HParams tab asks for them: every hparam, and sorted by eval accuracy, best first."""
    experiment = _post(url, "/data/plugin/hparams/experiment", {"experimentName": ""})
    columns = [{"hparam": h["name"], "includeInResult": True} for h in experiment["hparamInfos"]]
    columns += [{"metric": m["name"], "includeInResult": True} for m in experiment["metricInfos"]]
    eval_accuracy = next(c for c in columns if c.get("metric") == {"group": "eval", "tag": "accuracy"})
    eval_accuracy["order"] = "ORDER_DESC"
    request = {"experimentName": "", "allowedStatuses": STATUSES, "colParams": columns, "startIndex": 0}
    return _post(url, "/data/plugin/hparams/session_groups", {**request, "sliceSize": 100})["sessionGroups"]


def test_hparams_ranks_runs_by_eval_accuracy_with_resolved_settings(server, logdir):
    experiment = _post(server, "/data/plugin/hparams/experiment", {"experimentName": ""})
    assert [(m["name"]["group"], m["name"]["tag"]) for m in experiment["metricInfos"]] == [
        ("eval", "accuracy"),
        ("eval", "loss"),
        ("train", "accuracy"),
        ("train", "loss"),
    ]
    names = {h["name"] for h in experiment["hparamInfos"]}
    assert {"micro_batches", "towers", "learning_rate", "train_steps", "precision"} <= names
    assert not any("model_dir" in n or "every_steps" in n for n in names)

    groups = _session_groups(server)
    sessions = {g["sessions"][0]["name"]: g for g in groups}
    assert sorted(sessions) == ["run_a", "run_b"] and all(len(g["sessions"]) == 1 for g in groups)
    assert [g["name"] for g in groups] == [g["sessions"][0]["name"] for g in groups]  # trial ID: the run's name
    metrics = logdir[1]
    best_first = sorted(sessions, key=lambda run: metrics[run]["eval_accuracy"], reverse=True)
    assert [g["sessions"][0]["name"] for g in groups] == best_first
    for run, group in sessions.items():
        values = {(m["name"]["group"], m["name"]["tag"]): m["value"] for m in group["metricValues"]}
        assert values[("eval", "accuracy")] == pytest.approx(metrics[run]["eval_accuracy"], abs=1e-6)
        assert values[("eval", "loss")] == pytest.approx(metrics[run]["eval_loss"], abs=1e-6)
        assert values[("train", "loss")] == pytest.approx(metrics[run]["train_loss"], abs=1e-6)
        hparams = group["hparams"]
        assert hparams["micro_batches"] == metrics[run]["micro_batches"] == 2  # resolved, not the 0 flag
        assert (hparams["towers"], hparams["precision"], hparams["parameter_device"]) == (2, "float32", "cpu")
        assert not any(v in ("None", None) for v in hparams.values())
        assert "model_dir" not in hparams and "max_staleness" not in hparams  # a path; async only
    assert sessions["run_a"]["hparams"]["train_steps"] == 20  # the target after the resume, recorded once
    assert sessions["run_b"]["hparams"]["train_steps"] == 10
    assert (sessions["run_a"]["hparams"]["learning_rate"], sessions["run_b"]["hparams"]["learning_rate"]) == (
        0.05,
        0.1,
    )


def test_towers_share_one_chart_and_the_projector_is_off(server, logdir):
    plugins = _get(server, "/data/plugins_listing")
    assert plugins["hparams"]["enabled"] and plugins["custom_scalars"]["enabled"]
    # The listing answers from a background check (False until it has run); the plugin's runs route checks
    # every run directory and the logdir for a checkpoint, synchronously.
    assert not plugins["projector"]["enabled"]
    assert _get(server, "/data/plugin/projector/runs") == []

    layout = _get(server, "/data/plugin/custom_scalars/layout")
    charts = [chart for category in layout["category"] for chart in category["chart"]]
    assert [c["multiline"]["tag"] for c in charts] == [["tower_step_sec/.*"]]  # one chart, merged over runs

    tags = _get(server, "/data/plugin/scalars/tags")
    assert {"loss", "accuracy"} <= set(tags["run_a/eval"])
    towers = sorted(t for t in tags["run_a/train"] if t.startswith("tower_step_sec/"))
    assert towers == ["tower_step_sec/tower_0", "tower_step_sec/tower_1"]
    # what the chart draws: every tower of every run, matched by the regex
    query = urllib.parse.urlencode({"run": "run_a/train", "tag": "tower_step_sec/.*"})
    scalars = _get(server, f"/data/plugin/custom_scalars/scalars?{query}")
    assert sorted(scalars["tag_to_events"]) == towers and scalars["regex_valid"]
    steps = [point[1] for point in scalars["tag_to_events"][towers[0]]]
    assert steps == [1, 5, 10, 11, 15, 20]  # strictly increasing across the resume (each start logs its first step)


def test_resume_of_an_old_model_dir_moves_its_checkpoints(tmp_path, run_a_at_10):
    """Runs before `checkpoints/` kept them in model_dir, where TensorBoard's Projector finds them."""
    run = tmp_path / "run"
    shutil.copytree(run_a_at_10, run)  # a 10-step run (lr 0.05), as run_a's first start
    for name in os.listdir(run / "checkpoints"):
        shutil.move(run / "checkpoints" / name, run / name)
    os.rmdir(run / "checkpoints")
    resumed = _trainer(run, 0.05, 20)
    assert resumed["global_step"] == 20 and resumed["attempts"][-1]["resumed_from_step"] == 10
    assert not [n for n in os.listdir(run) if n.startswith("ckpt-") or n == "checkpoint"]
    assert sorted(os.listdir(run / "checkpoints"))[-2:] == ["ckpt-20.data-00000-of-00001", "ckpt-20.index"]


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
INDIGO = (63, 81, 181)  # the HParams tab's ticked checkboxes: drawn only once the experiment loaded
ORANGE = (245, 124, 0)  # TensorBoard's header bar


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's headless chromium (apt-get install -y chromium)")
def test_the_hparams_tab_renders_in_a_browser(server, tmp_path):
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    png = tmp_path / "hparams.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"]
    flags += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
    flags += [f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}", "--window-size=1800,900"]
    flags += ["--virtual-time-budget=15000"]  # lets the page's scripts fetch and draw before the shot
    done = subprocess.run([CHROMIUM, *flags, f"{server}/#hparams"], capture_output=True, text=True, timeout=120)
    assert png.exists() and png.stat().st_size > 20_000, done.stderr[-2000:]
    pixels = tf.io.decode_png(png.read_bytes(), channels=3).numpy().reshape(-1, 3)
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    share = {tuple(int(c) for c in colour): n / len(pixels) for colour, n in zip(colours, counts, strict=True)}
    assert len(share) > 100 and share.get(ORANGE, 0) > 0.05 and share.get(INDIGO, 0) > 0.001, sorted(
        share.items(), key=lambda item: -item[1]
    )[:8]
