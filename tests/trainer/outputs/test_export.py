"""The serving export (`trainer.outputs.export`): `export/<step>/` loads in a fresh process, and its three signatures
classify the eval digits as the run's own eval did; reruns keep an export, resumes add one beside it."""

import hashlib
import json
import os
import select
import subprocess
import sys
import time

import pytest

from tests.support.paths import ROOT
from tests.support.runs import cpu_flags

DIGITS_FLAGS = cpu_flags(train_steps=150, eval_every_steps=0, log_every_steps=150)
OUTPUT_NAMES = {"logits", "probabilities", "classes"}

# A client in a fresh process: nothing of the trainer is imported, only TensorFlow and the eval data. It answers
# one request a line on stdin, [export_dir, "digits" (classify the eval digits three ways) or an eval glob of
# dense records], with one `report {...}` line on stdout; each export is loaded afresh. One process serves the
# module's six exports (one TensorFlow start, not six).
_CLIENT = r"""
import json, sys, traceback
import numpy as np
import tensorflow as tf

def answer(export_dir, what):
    loaded = tf.saved_model.load(export_dir)
    sigs = loaded.signatures
    report = {"signatures": sorted(sigs), "inputs": {}, "outputs": {}, "classes": {}}
    for name, fn in sigs.items():
        inputs = fn.structured_input_signature[1].items()
        report["inputs"][name] = {k: [v.dtype.name, v.shape.as_list()] for k, v in inputs}
        report["outputs"][name] = {k: v.dtype.name for k, v in fn.structured_outputs.items()}

    def classify(name, **inputs):
        out = {k: v.numpy() for k, v in sigs[name](**inputs).items()}
        report.setdefault("prob_sum_error", 0.0)
        error = float(np.max(np.abs(out["probabilities"].sum(-1) - 1)))
        report["prob_sum_error"] = max(report["prob_sum_error"], error)
        assert np.array_equal(out["classes"], np.argmax(out["logits"], -1))
        report["classes"][name] = out["classes"].tolist()

    if what == "digits":
        from data.digits import digits_splits
        _, (images, labels) = digits_splits()  # uint8 (360, 8, 8, 1), the eval records' pixels and labels
        png = [tf.io.encode_png(image).numpy() for image in images]
        classify("serving_default", image_bytes=tf.constant(png))
        classify("predict_uint8", images=tf.constant(images))
        classify("predict_float", images=tf.constant(images.astype(np.float32) / np.float32(255)))
        jpeg = [tf.io.encode_jpeg(image, quality=95).numpy() for image in images]  # lossy: not one of the three
        jpeg_classes = sigs["serving_default"](image_bytes=tf.constant(jpeg))["classes"].numpy()
        report["jpeg_accuracy"] = float(np.mean(jpeg_classes == labels))
    else:
        import data
        info = data.inspect_records(what)
        features, labels = next(iter(data.make_dataset(info, batch_size=10**6, training=False)))
        classify("predict_float", features=features)
        classify("serving_default", features=features)
        labels = np.asarray(labels)
    report["accuracy"] = {k: float(np.mean(np.asarray(v) == labels)) for k, v in report["classes"].items()}
    report["num_examples"] = len(labels)
    return report

for line in sys.stdin:
    try:
        print("report " + json.dumps(answer(*json.loads(line))), flush=True)
    except Exception:
        print("failed " + json.dumps(traceback.format_exc()), flush=True)
"""


def _run(*args):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-m", "trainer", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """`client(export_dir, what="digits")`: the client's report on one export, from the module's one client
    process (started by the first test that asks)."""
    stderr = tmp_path_factory.mktemp("client") / "stderr.txt"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    with open(stderr, "w") as err:
        process = subprocess.Popen(
            [sys.executable, "-c", _CLIENT], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=err,
        )  # fmt: skip
    pending = bytearray()  # what the client printed past the last line read

    def line(deadline: float) -> str:
        while b"\n" not in pending:
            ready, _, _ = select.select([process.stdout], [], [], max(deadline - time.monotonic(), 0))
            assert ready, f"no answer from the client in 300 s: {stderr.read_text()[-3000:]}"
            chunk = os.read(process.stdout.fileno(), 1 << 16)
            assert chunk, f"the client ended (exit {process.wait()}): {stderr.read_text()[-3000:]}"
            pending.extend(chunk)
        first, _, rest = bytes(pending).partition(b"\n")
        pending[:] = rest
        return first.decode()

    def ask(export_dir, what="digits") -> dict:
        process.stdin.write(json.dumps([str(export_dir), what]).encode() + b"\n")
        process.stdin.flush()
        deadline = time.monotonic() + 300
        while not (answer := line(deadline)).startswith(("report ", "failed ")):
            pass  # anything else the client printed
        if answer.startswith("failed "):
            raise AssertionError(json.loads(answer.removeprefix("failed ")))
        return json.loads(answer.removeprefix("report "))

    yield ask
    process.stdin.close()
    process.wait(timeout=60)


def _metrics(run) -> dict:
    return json.loads((run / "metrics.json").read_text())


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """The default digits, trained briefly on 2 CPU towers and exported; (run dir, metrics at the end)."""
    run = tmp_path_factory.mktemp("export") / "run"
    _run(*DIGITS_FLAGS, f"--model_dir={run}")
    return run, _metrics(run)


def test_three_signatures_classify_the_eval_digits_as_eval_did(digits_run, client):
    run, metrics = digits_run
    assert metrics["global_step"] == 150 and metrics["eval_accuracy"] > 0.95
    assert sorted(os.listdir(run / "export")) == ["150"]
    report = client(run / "export" / "150")
    assert report["signatures"] == ["predict_float", "predict_uint8", "serving_default"]
    assert report["inputs"] == {
        "serving_default": {"image_bytes": ["string", [None]]},
        "predict_uint8": {"images": ["uint8", [None, 8, 8, 1]]},
        "predict_float": {"images": ["float32", [None, 8, 8, 1]]},
    }
    for outputs in report["outputs"].values():
        assert outputs == {"logits": "float32", "probabilities": "float32", "classes": "int64"}
    classes = report["classes"]
    assert classes["serving_default"] == classes["predict_uint8"] == classes["predict_float"]
    # The same model, images and argmax as the run's eval (whose batch is split across the towers): equal.
    assert report["num_examples"] == metrics["eval_examples"] == 360
    assert report["accuracy"]["serving_default"] == metrics["eval_accuracy"]
    assert report["prob_sum_error"] < 1e-5
    assert report["jpeg_accuracy"] > 0.9


def test_contract_file_states_inputs_outputs_and_labels(digits_run):
    run, _ = digits_run
    contract = json.loads((run / "export" / "150" / "assets.extra" / "towerflow_serving.json").read_text())
    assert (contract["model"], contract["global_step"], contract["schema"]) == ("cnn", 150, "image")
    assert (contract["num_classes"], contract["label_offset"]) == (10, 0)
    assert contract["signatures"]["predict_float"]["images"] == {
        "dtype": "float32",
        "shape": [None, 8, 8, 1],
        "range": [0.0, 1.0],
        "layout": "NHWC",
        "scaling": "pixel / 255",
        "content": "decoded pixels at 8x8, divided by 255",
        "in_graph": "multiplied by 255 (exact for pixel / 255), resized bilinear to 8x8 (the identity), scaled by "
        "1/255, not normalized: what eval does to the records",
    }
    assert contract["signatures"]["predict_uint8"]["images"]["range"] == [0, 255]
    assert set(contract["outputs"]) == OUTPUT_NAMES


def test_rerun_keeps_the_export_and_a_resume_adds_one_beside_it(digits_run, client):
    run, _ = digits_run
    saved = run / "export" / "150" / "saved_model.pb"
    before = (_sha256(saved), saved.stat().st_mtime_ns)
    rerun = _run(*DIGITS_FLAGS, f"--model_dir={run}")
    assert "already complete: step 150 of --train_steps=150; nothing to do" in rerun.stdout
    metrics = (run / "metrics.json").read_text()
    (run / "metrics.json").unlink()  # a finished run without its metrics: evaluated again, export kept
    rerun = _run(*DIGITS_FLAGS, f"--model_dir={run}")
    assert "export/150 exists; kept" in rerun.stdout
    assert json.loads((run / "metrics.json").read_text())["eval_accuracy"] == json.loads(metrics)["eval_accuracy"]
    assert (_sha256(saved), saved.stat().st_mtime_ns) == before
    resumed = _run(*DIGITS_FLAGS[:2], "--train_steps=160", "--eval_every_steps=0", f"--model_dir={run}")
    assert "exported to export/160" in resumed.stdout
    assert sorted(os.listdir(run / "export")) == ["150", "160"]
    assert (_sha256(saved), saved.stat().st_mtime_ns) == before
    assert client(run / "export" / "160")["accuracy"]["predict_uint8"] == _metrics(run)["eval_accuracy"]


def test_an_unfinished_export_is_removed_and_never_looks_like_a_version(digits_run, tmp_path):
    from trainer.outputs import export

    base = tmp_path / "export"
    (base / ".partial-7-123" / "variables").mkdir(parents=True)
    lines = []
    export._remove_partial(str(base), lines.append)
    assert os.listdir(base) == [] and lines == ["export: removed .partial-7-123, an export that did not finish"]


def test_spread_bf16_export_loads_and_returns_float32(tmp_path, client):
    run = tmp_path / "run"
    flags = ("--parameter_device=spread", "--mixed_precision=bf16", "--train_steps=40", "--eval_every_steps=0")
    _run(*cpu_flags(), *flags, f"--model_dir={run}")
    metrics = _metrics(run)
    assert len(metrics["parameter_devices"]) == 2  # the variables really were on two devices
    report = client(run / "export" / "40")
    for outputs in report["outputs"].values():
        assert outputs == {"logits": "float32", "probabilities": "float32", "classes": "int64"}
    assert report["classes"]["serving_default"] == report["classes"]["predict_float"]
    assert abs(report["accuracy"]["predict_float"] - metrics["eval_accuracy"]) <= 1 / 360


def test_two_task_spread_run_exports_from_the_chief(tmp_path, client):
    """Variables on the CPUs of two processes (standing in for machines); the chief writes the export."""
    from tests.support.cluster import Job, tf_config_envs

    job = Job(tmp_path / "run", tf_config_envs(2), 2, "--parameter_device=spread", "--train_steps=20", "--export")
    assert job.wait() == [0, 0], job.output(0)[-3000:]
    metrics = _metrics(tmp_path / "run")
    assert {d.split("/device:")[0] for d in metrics["parameter_devices"]} == {
        "/job:worker/replica:0/task:0",
        "/job:worker/replica:0/task:1",
    }
    report = client(tmp_path / "run" / "export" / "20")
    assert report["classes"]["serving_default"] == report["classes"]["predict_uint8"]
    assert report["accuracy"]["serving_default"] == metrics["eval_accuracy"]


def test_dense_export_takes_float_features(tmp_path, client):
    records = tmp_path / "dense"
    from data import prepare  # in this process: the records are the input here, not what is tested

    assert prepare.main(["synthetic", str(records), "--shape=20", "--num_classes=4", "--num_examples=1000"]) == 0
    run = tmp_path / "run"
    eval_glob = str(records / "eval-*")
    flags = (f"--train_data={records / 'train-*'}", f"--eval_data={eval_glob}", "--num_classes=4", "--model=mlp")
    _run(*cpu_flags(train_steps=30, eval_every_steps=0), *flags, f"--model_dir={run}")
    report = client(run / "export" / "30", eval_glob)
    assert report["signatures"] == ["predict_float", "serving_default"]
    assert report["inputs"]["serving_default"] == {"features": ["float32", [None, 20]]}
    assert set(report["outputs"]["predict_float"]) == OUTPUT_NAMES
    assert report["accuracy"]["predict_float"] == _metrics(run)["eval_accuracy"]
    contract = json.loads((run / "export" / "30" / "assets.extra" / "towerflow_serving.json").read_text())
    assert (contract["schema"], contract["num_classes"]) == ("dense", 4)


def test_export_applies_the_runs_normalization_as_eval_did(tmp_path, client):
    """--normalize is in every signature (the same resolved preprocessing eval applies): the export of a run
    trained on normalized pixels classifies the eval digits exactly as its eval did (it answered at chance,
    0.09, when the export ignored --normalize)."""
    run = tmp_path / "run"
    _run(*DIGITS_FLAGS, "--normalize=0.5,0.1", f"--model_dir={run}")
    metrics = _metrics(run)
    assert metrics["normalize"] == "0.5,0.1" and metrics["eval_accuracy"] > 0.95
    report = client(run / "export" / "150")
    classes = report["classes"]
    assert classes["serving_default"] == classes["predict_uint8"] == classes["predict_float"]
    assert report["accuracy"]["serving_default"] == metrics["eval_accuracy"]
    contract = json.loads((run / "export" / "150" / "assets.extra" / "towerflow_serving.json").read_text())
    assert contract["preprocessing"]["normalize"]["mean"] == [0.5]
    assert contract["preprocessing"]["normalize"]["std"] == [0.1]
    assert contract["preprocessing"]["eval_crop"] is False
