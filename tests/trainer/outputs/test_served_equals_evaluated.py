"""What the SavedModel serves is what the run evaluated (issue #20), for every --augment and --normalize value.

Each case trains briefly on real image records (`data.prepare synthetic`, 32x32x3, PNG or JPEG),
then two fresh processes, each answering for all five runs, answer for the same eval files: the trainer's own
eval pipeline and model (its flags from flags.txt, `trainer.loop.build.build`, the final checkpoint restored,
`Evaluator.predictions`: the towers, split and graph that computed metrics.json's eval_accuracy), and a client
that imports only TensorFlow and feeds the export the eval records' encoded images (`serving_default`), their
decoded uint8 pixels (`predict_uint8`) and pixels / 255 (`predict_float`). Five runs cover each augmentation
and each normalization (custom: per channel and one for all) at least once; the first trains and evaluates the
model split over 2 devices per tower (`--tensor_layout`), whose export is the whole model on one device. The
model is the mlp: the cnn's BatchNorm statistics are still far from the batches' after a few dozen steps, and
its eval answers at chance. The JPEG records (smooth, photo-like class templates) survive crops and flips; under
imagenet eval decodes only the crop of a JPEG (`decode_and_crop_jpeg`) while the client decodes it whole.
"""

import contextlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support.paths import ROOT
from tests.support.runs import cpu_flags

CUSTOM = "0.5,0.45,0.4,0.25,0.2,0.3"
CASES = [  # (augment, normalize, image format, devices); the most devices first: the eval process builds them in order
    ("flip", "imagenet", "png", "2 towers of 2, 4 shards"),
    ("none", "none", "png", "2 towers"),
    ("crop_flip", CUSTOM, "jpeg", "2 towers"),
    ("imagenet", "imagenet", "jpeg", "2 towers"),
    ("imagenet", "0.45,0.25", "jpeg", "2 towers"),
]
# (flip, imagenet, jpeg, 2 towers) served what the first case and crop_flip's do: flips are the training's
# alone, so its export decoded a JPEG whole (crop_flip's), normalized as imagenet (the first case's).
# The tensor-parallel case: the mlp's two hidden layers split by --tensor_layout, trained and evaluated on 2 towers
# of 2 devices, exported whole (one device).
DEVICES = {
    "2 towers": {"num_gpus": 2},
    "2 towers of 2, 4 shards": {
        "num_gpus": 4,
        "tensor_parallel": 2,
        "tensor_shards": 4,
        "micro_batches": 2,
        "tensor_layout": "dense1=column,dense2=row",
    },
}
SIGNATURES = ("serving_default", "predict_uint8", "predict_float")

# The trainer's eval of each run in argv, in one fresh process: the run's own flags, built and restored as a
# resume would be. One JSON line per run.
_EVAL = r"""
import json, sys
import numpy as np
from absl import flags
from trainer.loop.build import build
from trainer.settings import flags as tf_flags

tf_flags.define_flags()
for run in sys.argv[1:]:
    flags.FLAGS(["eval", f"--flagfile={run}/flags.txt"])  # every flag: flags.txt lists them all
    trainer = build(tf_flags.config_from_flags(flags.FLAGS))
    assert trainer.checkpointer.restore_latest() is not None
    outputs, batches = trainer.evaluator.predictions()
    logits, labels = np.concatenate(outputs), np.concatenate([labels for _, labels in batches])
    print(json.dumps({"logits": logits.tolist(), "labels": labels.tolist()}))
"""

# A client in one fresh process: only TensorFlow, each export (argv: export, eval files, ...) and its eval files.
_CLIENT = r"""
import json, sys
import tensorflow as tf

spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string), "image/class/label": tf.io.FixedLenFeature([], tf.int64)}
for export, eval_files in zip(sys.argv[1::2], sys.argv[2::2]):
    serve = tf.saved_model.load(export).signatures
    files = sorted(tf.io.gfile.glob(eval_files))
    records = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(files)]
    encoded = [r["image/encoded"] for r in records]
    images = tf.stack([tf.io.decode_image(e, channels=3, expand_animations=False) for e in encoded])
    inputs = {
        "serving_default": {"image_bytes": tf.stack(encoded)},
        "predict_uint8": {"images": images},
        "predict_float": {"images": tf.cast(images, tf.float32) / 255.0},
    }
    report = {name: serve[name](**kwargs)["logits"].numpy().tolist() for name, kwargs in inputs.items()}
    report["labels"] = [int(r["image/class/label"]) for r in records]
    print(json.dumps(report))
"""


def _python(*args, timeout=300) -> str:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _records(base) -> dict:
    """format -> records directory: 32x32x3 synthetic images, 10 classes, 1000 train and 200 eval examples;
    `data.prepare synthetic` in this process (the records are the input here, not what is tested: no
    TensorFlow start of their own)."""
    from data import prepare

    made = {}
    for image_format in ("png", "jpeg"):
        out = base / image_format
        flags = ("--shape=32,32,3", "--num_classes=10", "--num_examples=1000", "--eval_examples=200")
        with contextlib.redirect_stdout(io.StringIO()):  # its --train_data= lines: not a test's output
            assert prepare.main(["synthetic", str(out), *flags, f"--format={image_format}", "--num_shards=2"]) == 0
        made[image_format] = out
    return made


def _json_lines(stdout: str, count: int) -> list[dict]:
    return [json.loads(line) for line in stdout.strip().splitlines()[-count:]]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict:
    """(augment, normalize, format) -> (run dir, eval glob, the trainer's eval, the client's answers): each case
    trained by its own `python -m trainer`; then every run's eval in one fresh process and every export's
    client in another (one TensorFlow start each, not one per case)."""
    base = tmp_path_factory.mktemp("served")
    records, runs = _records(base), {}
    for i, case in enumerate(CASES):
        augment, normalize, image_format, devices = case
        run, eval_glob = base / f"run-{i}", str(records[image_format] / "eval-*")
        flags = cpu_flags(
            **DEVICES[devices],
            model="mlp",
            train_data=records[image_format] / "train-*",
            eval_data=eval_glob,
            num_classes=10,
            augment=augment,
            normalize=normalize,
            global_batch_size=32,
            train_steps=40,
            eval_every_steps=0,
            log_every_steps=40,
        )
        _python("-m", "trainer", *flags, f"--model_dir={run}")
        runs[case] = (run, eval_glob)
    evaluated = _json_lines(_python("-c", _EVAL, *(str(run) for run, _ in runs.values())), len(CASES))
    pairs = [arg for run, eval_glob in runs.values() for arg in (str(run / "export" / "40"), eval_glob)]
    answered = _json_lines(_python("-c", _CLIENT, *pairs), len(CASES))
    return {case: (*runs[case], evaluated[i], answered[i]) for i, case in enumerate(CASES)}


@pytest.mark.parametrize(("augment", "normalize", "image_format", "devices"), CASES)
def test_export_serves_what_eval_evaluated(served, augment, normalize, image_format, devices):
    run, _, evaluated, served_logits = served[augment, normalize, image_format, devices]
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["augment"], metrics["normalize"]) == (augment, normalize)
    split = DEVICES[devices].get("tensor_parallel", 1), DEVICES[devices].get("tensor_shards", 1)
    assert tuple(metrics["tensor_parallel"].values()) == split
    labels, eval_logits = np.array(evaluated["labels"]), np.array(evaluated["logits"])
    eval_classes = np.argmax(eval_logits, axis=-1)
    assert len(labels) == metrics["eval_examples"] == 200
    assert abs(np.mean(eval_classes == labels) - metrics["eval_accuracy"]) < 1e-9  # the same eval, recomputed
    assert metrics["eval_accuracy"] > 0.3  # learned something (chance: 0.1), so the comparison means something

    assert served_logits["labels"] == labels.tolist()  # the same examples in the same order
    for name in SIGNATURES:
        logits = np.array(served_logits[name])
        classes = np.argmax(logits, axis=-1)
        # The same preprocessing and model: the logits too, up to the batch's arithmetic (eval splits it).
        np.testing.assert_allclose(logits, eval_logits, rtol=1e-4, atol=1e-4, err_msg=name)
        assert np.mean(classes == eval_classes) >= 0.999, name
        assert abs(np.mean(classes == labels) - metrics["eval_accuracy"]) <= 1e-3, name
    _check_contract(run / "export" / "40", augment, normalize)


def _check_contract(export_dir, augment, normalize):
    contract = json.loads((export_dir / "assets.extra" / "towerflow_serving.json").read_text())
    preprocessing = contract["preprocessing"]
    crops = augment == "imagenet"
    assert (preprocessing["augment"], preprocessing["eval_crop"]) == (augment, crops)
    assert preprocessing["steps"][: 3 if crops else 2] == ["eval_crop"] * crops + ["resize_bilinear", "scale_1/255"]
    assert (preprocessing["normalize"] is None) == (normalize == "none")
    for name in SIGNATURES:
        (spec,) = contract["signatures"][name].values()
        assert ("central 87.5% of each side" in spec["in_graph"]) == crops, name
        assert ("normalized (x - mean) / std" in spec["in_graph"]) == (normalize != "none"), name
