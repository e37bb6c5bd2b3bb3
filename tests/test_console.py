"""What a user sees: one definition of the train scalars, the live line, banner and summary, histograms as
TensorBoard draws them, "already complete", and the warning on a stretched schedule."""

import io
import json

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.histogram import summary_v2

from trainer.loop.run import train
from trainer.outputs import costs, progress
from trainer.outputs.summaries import histogram_buckets


def _scalars(directory, tag: str) -> dict[int, float]:
    acc = event_accumulator.EventAccumulator(str(directory), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    return {e.step: float(tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)}


def test_logged_loss_is_over_the_steps_since_the_last_log_line_whatever_other_cadences(make_config, tmp_path):
    """Histograms every 5 steps cut the windows differently; the loss logged every 10 steps is the same."""
    plain = train(make_config(model_dir=tmp_path / "a", loop={"train_steps": 20, "log_every_steps": 10}))
    cut = train(
        make_config(
            model_dir=tmp_path / "b",
            loop={"train_steps": 20, "log_every_steps": 10, "histogram_every_steps": 5, "checkpoint_every_steps": 3},
        )
    )
    assert plain["weights_sha256"] == cut["weights_sha256"]
    for tag in ("loss", "accuracy", "grad_global_norm"):
        a, b = _scalars(tmp_path / "a" / "train", tag), _scalars(tmp_path / "b" / "train", tag)
        assert sorted(a) == [1, 10, 20]  # the first step of a start is logged on its own
        assert a == pytest.approx(b, rel=1e-6), tag
    # A rate needs a step that traced no graph: none at step 1, one at every later log line.
    rates = _scalars(tmp_path / "a" / "train", "examples_per_sec")
    assert sorted(rates) == [10, 20] and all(r > 0 for r in rates.values())


def test_console_has_a_banner_a_first_step_line_and_a_summary(make_config, tmp_path, capsys):
    metrics = train(make_config(loop={"train_steps": 12, "log_every_steps": 6, "eval_every_steps": 12}))
    out = capsys.readouterr().out
    assert "model      cnn: " in out and "trainable parameters" in out
    assert "towers     2 (sync, deterministic): tower 0 (" in out
    assert "batch      64 per step = 2 micro-batches of 32" in out
    assert f"model_dir  {tmp_path / 'run'}, training to step 12" in out
    assert "step       1/12  loss " in out and "first step " in out
    assert "step       6/12" in out and "ex/s  eta 0:00:" in out
    assert "done: step 12 in 0:00:" in out
    assert f"eval accuracy {metrics['eval_accuracy']:.4f}" in out
    assert f"outputs: {tmp_path / 'run' / 'metrics.json'}" in out and f"--logdir={tmp_path / 'run'}" in out
    assert out.index("model      cnn") < out.index("step       1/12") < out.index("done: step 12")
    assert "warning" not in out and metrics["cost_warnings"] == []  # float32, no XLA: nothing known to cost


def test_settings_slow_on_cpus_warn_only_on_cpu_towers(make_config):
    """fp16 and XLA were measured slower on CPUs only: GPU towers get no warning (checked without a GPU)."""
    slow = {"mixed_precision": "fp16", "jit_compile": True}
    on_cpu = costs.cost_warnings(make_config(towers=slow))
    assert [w.split(" on ")[0] for w in on_cpu] == ["--mixed_precision=fp16", "--xla"]
    assert all("benchmarks/results/headline.md" in w for w in on_cpu)
    assert costs.cost_warnings(make_config(towers={**slow, "device": "gpu"})) == []
    assert costs.cost_warnings(make_config(towers={"mixed_precision": "bf16"})) == []


@pytest.mark.parametrize(
    ("model", "augment"), [("cnn", "none (auto for cnn)"), ("resnet20", "crop_flip (auto for resnet20)")]
)
def test_banner_and_metrics_say_what_auto_resolved_to(make_config, tmp_path, capsys, model, augment):
    """--augment=auto and --cache=auto (the defaults) differ per model and data; the banner and metrics.json
    say what the run actually trained on (the digits: ~90 KB decoded, so cached)."""
    metrics = train(make_config(model={"name": model}, loop={"train_steps": 2}))
    out = capsys.readouterr().out
    assert f"augment    {augment}, normalize none, cache memory (auto: ~90 KB decoded)\n" in out
    assert out.index("data       train ") < out.index("augment    ") < out.index("optimizer  ")
    expected = {"augment": augment.split()[0], "normalize": "none", "cache": "memory", "cache_decoded_bytes": 90226}
    assert {k: metrics[k] for k in expected} == expected
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["augment"] == expected["augment"]


def test_a_finished_run_rerun_is_announced_and_left_as_it_is(make_config, tmp_path, capsys):
    config = make_config(loop={"train_steps": 6, "checkpoint_every_steps": 3})
    first = train(config)
    before = (tmp_path / "run" / "metrics.json").read_text()
    capsys.readouterr()
    again = train(config)
    out = capsys.readouterr().out
    assert "already complete: step 6 of --train_steps=6; nothing to do" in out
    assert again == first and (tmp_path / "run" / "metrics.json").read_text() == before
    attempts = json.loads((tmp_path / "run" / "attempts.json").read_text())
    assert len(attempts) == 1  # no new attempt: nothing was trained


def test_extending_a_cosine_run_warns_that_the_schedule_is_stretched(make_config, tmp_path, capsys):
    from trainer.outputs import rundir
    from trainer.step.modes import settle

    config = make_config(loop={"train_steps": 6, "checkpoint_every_steps": 3})
    train(config)
    (tmp_path / "run" / "flags.txt").write_text("--train_steps=6\n")  # as `python -m trainer` records it
    capsys.readouterr()
    longer = make_config(loop={"train_steps": 9, "checkpoint_every_steps": 3})
    rundir.check_resume(settle(longer), allow_changes=False)
    assert "warning: --train_steps 6 -> 9: the cosine schedule now decays to 0 at step 9" in capsys.readouterr().out


def test_live_line_redraws_at_most_once_a_second_and_clears():
    stream, step = io.StringIO(), tf.Variable(0, dtype=tf.int64)
    line = progress.ProgressLine(stream, 100, 64, step, latest_loss=lambda: tf.constant(0.25))
    line.window_started(0)
    step.assign(10)
    line.tick()
    first = stream.getvalue()
    assert first.startswith("\r\033[Kstep      10/100  loss 0.2500  ") and " ex/s  eta " in first
    step.assign(20)
    line.tick()  # within the same second: no redraw
    assert stream.getvalue() == first
    line.clear()
    assert stream.getvalue() == first + "\r\033[K"


@pytest.mark.parametrize(
    "values",
    [
        np.random.default_rng(0).normal(size=(3, 3, 8, 16)).astype(np.float32),
        np.array([1.0, 2.0, 2.5, 9.0, -4.0], np.float32),
        np.full([7], 3.0, np.float32),  # every value the same: all in the last bucket
    ],
)
def test_histogram_buckets_are_tensorboards(values):
    ours = histogram_buckets(tf.constant(values)).numpy()
    theirs = summary_v2._buckets(tf.constant(values), tf.constant(30)).numpy()
    np.testing.assert_allclose(ours[:, :2], theirs[:, :2], rtol=1e-12)
    np.testing.assert_array_equal(ours[:, 2], theirs[:, 2])
    assert ours[:, 2].sum() == values.size
