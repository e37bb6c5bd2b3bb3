"""Training end to end on logical CPU towers: accuracy, outputs in model_dir, events, resume, user data."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

import data
from trainer.loop.run import train
from trainer.outputs import rundir


def _events(directory) -> event_accumulator.EventAccumulator:
    acc = event_accumulator.EventAccumulator(str(directory), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    return acc


def test_digits_reach_95_percent_and_leave_every_output(make_config, tmp_path):
    config = make_config(
        deterministic=False,
        towers={"num_towers": 2, "global_batch_size": 128},
        loop={
            "train_steps": 300,
            "log_every_steps": 100,
            "eval_every_steps": 150,
            "checkpoint_every_steps": 150,
            "histogram_every_steps": 100,
            "export": True,
        },
    )
    metrics = train(config)
    run = tmp_path / "run"
    assert metrics["eval_accuracy"] >= 0.95
    assert metrics["eval_examples"] == 360
    on_disk = json.loads((run / "metrics.json").read_text())
    for key in (
        "global_step",
        "train_loss",
        "eval_loss",
        "eval_accuracy",
        "examples_per_sec",
        "num_towers",
        "micro_batches",
        "weights_sha256",
    ):
        assert (
            on_disk[key] == pytest.approx(metrics[key])
            if isinstance(metrics[key], float)
            else on_disk[key] == metrics[key]
        )
    assert (on_disk["global_step"], on_disk["num_towers"], on_disk["micro_batches"]) == (300, 2, 2)
    assert len(on_disk["weights_sha256"]) == 64 and on_disk["examples_per_sec"] > 0
    assert tf.train.latest_checkpoint(str(run / "checkpoints")).endswith("ckpt-300")
    exported = tf.saved_model.load(str(run / "export" / "300"))  # one version directory per final step
    images, labels = next(
        iter(data.make_dataset(data.inspect_records(data.ensure_digits()[1]), batch_size=360, training=False))
    )
    classes = exported.signatures["predict_float"](images=images)["classes"].numpy()
    exported_accuracy = np.mean(classes == labels.numpy())
    assert exported_accuracy == pytest.approx(metrics["eval_accuracy"])


def test_event_files_hold_scalars_histograms_and_hparams(make_config, tmp_path):
    train(
        make_config(loop={"train_steps": 10, "log_every_steps": 5, "histogram_every_steps": 5, "eval_every_steps": 10})
    )
    train_events = _events(tmp_path / "run" / "train")
    tags = set(train_events.Tags()["tensors"])
    for scalar in (
        "loss",
        "accuracy",
        "learning_rate",
        "grad_global_norm",
        "examples_per_sec",
        "tower_step_sec/tower_0",
        "tower_step_sec/tower_1",
    ):
        assert scalar in tags
    assert [e.step for e in train_events.Tensors("loss")] == [1, 5, 10]  # the first step of a start, then every 5
    # Stable tags: index + path without Keras's counters; one gradient and one weight histogram per variable.
    assert "gradients/000_conv1/kernel" in tags and "weights/000_conv1/kernel" in tags
    assert (
        sum(t.startswith("gradients/") for t in tags) == 10
    )  # cnn: 2 conv kernels, 2 BN (gamma, beta), 2 dense (kernel, bias)
    assert [e.step for e in train_events.Tensors("gradients/000_conv1/kernel")] == [5, 10]
    # the run's settings and the towers' chart layout sit in model_dir itself, the HParams session
    run_tags = set(_events(tmp_path / "run").Tags()["tensors"])
    assert {"_hparams_/session_start_info", "_hparams_/experiment", "custom_scalars__config__"} <= run_tags
    eval_events = _events(tmp_path / "run" / "eval")
    assert [e.step for e in eval_events.Tensors("accuracy")] == [10]


@pytest.mark.quick
def test_rerun_resumes_and_continues_the_step_count(make_config, tmp_path):
    """The mlp: what is counted and kept does not depend on the model, and it traces in half the cnn's time."""
    first = train(make_config(model={"name": "mlp"}, loop={"train_steps": 10, "checkpoint_every_steps": 5}))
    assert first["global_step"] == 10
    second = train(make_config(model={"name": "mlp"}, loop={"train_steps": 16, "checkpoint_every_steps": 5}))
    assert second["global_step"] == 16
    checkpoints = tf.train.get_checkpoint_state(str(tmp_path / "run" / "checkpoints")).all_model_checkpoint_paths
    assert [os.path.basename(p) for p in checkpoints] == ["ckpt-10", "ckpt-15", "ckpt-16"]  # keep 3


def test_resume_with_another_model_fails_clearly(make_config, tmp_path):
    train(make_config(loop={"train_steps": 2}))
    with pytest.raises(rundir.RunDirError, match="holds a run these flags would change \\(--model: 'cnn' -> 'mlp'\\)"):
        train(make_config(model={"name": "mlp"}, loop={"train_steps": 4}))
    # forced past that check, the checkpoint itself still refuses another model
    with pytest.raises(RuntimeError, match="cannot resume from .*ckpt-2.*flags.history"):
        train(make_config(model={"name": "mlp"}, loop={"train_steps": 4, "allow_flag_changes": True}))


def _foreign_image_records(directory, num_examples, rng):
    """Records as another program writes them: JPEG bytes and a 1-based label, no height/width/channels."""
    path = os.path.join(directory, "foreign.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(num_examples):
            label = i % 3
            image = rng.integers(0, 40, (12, 12, 3), dtype=np.uint8)
            image[:, :, label] += 160  # class = the bright channel: linearly separable
            feature = {
                "image/encoded": tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[tf.io.encode_jpeg(image).numpy()])
                ),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label + 1])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return path


def test_foreign_image_records_with_label_offset_train(make_config, tmp_path):
    path = _foreign_image_records(tmp_path, 96, np.random.default_rng(0))
    metrics = train(
        make_config(
            model={"name": "mlp"},
            data={"train_data": path, "eval_data": path, "num_classes": 3, "label_offset": 1},
            towers={"num_towers": 2, "global_batch_size": 32},
            optimizer={"schedule": "constant"},
            loop={"train_steps": 30},
        )
    )
    assert metrics["eval_examples"] == 96
    assert metrics["eval_accuracy"] == 1.0  # three well-separated colour classes


def test_dense_records_train(make_config, tmp_path):
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 256)
    features = (rng.normal(size=(256, 6)) + labels[:, None] * 2.0).astype(np.float32)
    files = data.write_dense_records(str(tmp_path / "tabular"), features, labels, num_shards=2)
    metrics = train(
        make_config(
            model={"name": "mlp"},
            data={"train_data": ",".join(files), "eval_data": files[0], "num_classes": 2},
            towers={"num_towers": 2, "global_batch_size": 32},
            loop={"train_steps": 40},
        )
    )
    assert metrics["eval_examples"] == 128 and metrics["eval_accuracy"] >= 0.9


@pytest.mark.quick
def test_unreadable_records_raise_data_error(make_config, tmp_path):
    junk = tmp_path / "junk.tfrecord"
    junk.write_bytes(b"this is not a TFRecord file at all")
    with pytest.raises(data.DataError, match="junk.tfrecord"):
        train(make_config(data={"train_data": str(junk), "eval_data": str(junk), "num_classes": 2}))
    with pytest.raises(data.DataError, match="no files match"):
        train(make_config(data={"train_data": str(tmp_path / "none-*"), "eval_data": str(junk), "num_classes": 2}))


@pytest.mark.parametrize("optimizer, schedule", [("sgd", "constant"), ("adamw", "cosine"), ("momentum", "piecewise")])
def test_optimizers_and_schedules_learn(make_config, optimizer, schedule):
    extra = {"boundaries": (10,), "values": (0.05, 0.01)} if schedule == "piecewise" else {}
    lr = 0.003 if optimizer == "adamw" else 0.05
    metrics = train(
        make_config(
            optimizer={
                "name": optimizer,
                "schedule": schedule,
                "learning_rate": lr,
                "warmup_steps": 0,
                "clip_global_norm": 5.0,
                **extra,
            },
            loop={"train_steps": 30, "eval_every_steps": 0},
        )
    )
    assert metrics["eval_accuracy"] >= 0.6  # chance is 0.1; 30 steps of 64 examples


@pytest.mark.parametrize(
    "towers",
    [{"jit_compile": True}, {"mixed_precision": "bf16"}, {"mixed_precision": "fp16", "global_batch_size": 16}],
    ids=["xla", "bf16", "fp16"],
)
def test_xla_and_mixed_precision_train(make_config, towers, capsys, tmp_path):
    """... and the two measured slower on CPUs (XLA, fp16) say what they cost, at start-up and in metrics.json."""
    import keras

    steps = 4 if towers.get("mixed_precision") == "fp16" else 20  # CPUs have no fp16 kernels: slow
    metrics = train(make_config(model={"name": "mlp"}, deterministic=False, towers=towers, loop={"train_steps": steps}))
    assert metrics["global_step"] == steps
    out = capsys.readouterr().out.splitlines()
    warned = [line.removeprefix("warning: ") for line in out if line.startswith("warning: ")]
    written = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert warned == metrics["cost_warnings"] == written["cost_warnings"]
    assert [line.split(" (")[0] for line in warned] == {
        "xla": ["--xla on CPU towers runs at 0.205"],
        "bf16": [],
        "fp16": ["--mixed_precision=fp16 on CPU towers runs at 0.255"],
    }[towers.get("mixed_precision") or "xla"]
    assert np.isfinite(metrics["train_loss"]) and metrics["eval_loss"] < np.log(10)  # below chance
    policy = {"bf16": "mixed_bfloat16", "fp16": "mixed_float16"}.get(towers.get("mixed_precision"), "float32")
    assert keras.mixed_precision.global_policy().name == policy
    keras.mixed_precision.set_global_policy("float32")


def test_profile_steps_write_a_trace(make_config, tmp_path):
    metrics = train(make_config(loop={"train_steps": 8, "log_every_steps": 0, "profile_steps": (3, 5)}))
    assert metrics["global_step"] == 8
    traces = list((tmp_path / "run" / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 1000
