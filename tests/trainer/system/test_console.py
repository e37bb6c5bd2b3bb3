"""What a user sees: one definition of the train scalars, the live line, banner and summary, histograms as
TensorBoard draws them, "already complete", and the warning on a stretched schedule."""

import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.histogram import summary_v2

from data import phase
from tests.support.paths import ROOT_PATH
from trainer.loop.build import build
from trainer.loop.run import train
from trainer.outputs import banner, costs, progress
from trainer.outputs.summaries import histogram_buckets
from trainer.system import console


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


def test_console_has_a_banner_a_first_step_line_and_a_summary(make_config, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(phase, "FIRST_LINE_SEC", 0.0)  # the eval's and export's progress line at once, off a terminal
    loop = {"train_steps": 12, "log_every_steps": 6, "eval_every_steps": 12, "export": True}
    metrics = train(make_config(loop=loop))
    out = capsys.readouterr().out
    assert "eval at step 12: 0 of 360 examples (0%), 0:00:00 so far\n" in out  # then a line a minute: none here
    assert "exporting to export/12: writing the SavedModel, 0:00:00 so far\n" in out
    assert len(re.findall(r"so far\n", out)) == 2 and "\r" not in out
    assert "model      cnn: " in out and "trainable parameters" in out
    assert "towers     2 (sync, deterministic): tower 0 (" in out
    assert "batch      64 per step = 2 micro-batches of 32" in out
    assert f"model_dir  {tmp_path / 'run'}, training to step 12" in out
    assert "step       1/12  loss " in out and "first step " in out
    # The times in h:mm:ss, whatever they are: a loaded machine takes a minute over these 12 steps.
    assert "step       6/12" in out and re.search(r"ex/s  eta \d+:\d\d:\d\d", out)
    assert re.search(r"done: step 12 in \d+:\d\d:\d\d", out)
    assert f"; eval loss {metrics['eval_loss']:.4f}, accuracy {metrics['eval_accuracy']:.4f} (" in out
    assert "task       classify" in out
    assert f"outputs: {tmp_path / 'run' / 'metrics.json'}" in out and f"--logdir={tmp_path / 'run'}" in out
    assert out.index("model      cnn") < out.index("step       1/12") < out.index("done: step 12")
    assert "warning" not in out and metrics["cost_warnings"] == []  # float32, no XLA: nothing known to cost


@pytest.mark.quick
def test_the_banner_says_one_micro_batch_and_a_layout_that_splits_nothing(make_config, tmp_path):
    """The mlp, 1 tower, and --tensor_layout at the default --tensor_shards=1: the layout is checked, and said."""
    config = make_config(towers={"num_towers": 1, "tensor_layout": ("dense1=column",)}, model={"name": "mlp"})
    state = build(config)
    lines = banner.start_lines(state.config, state)
    assert "batch      64 per step = 1 micro-batch of 64" in lines
    assert [line for line in lines if line.startswith("tensor ")] == [
        "tensor     --tensor_layout splits nothing at --tensor_shards=1"
    ]
    plain = build(make_config())  # nothing split, no layout: no tensor line
    assert not [line for line in banner.start_lines(plain.config, plain) if line.startswith("tensor")]


def test_the_banner_of_a_pipeline_names_its_stages_their_layers_and_where_their_variables_live(
    make_config, tmp_path, capsys
):
    """2 devices as 1 pipeline of 2 stages: no `towers 2` line, each stage's device, layers and variables; and
    what the stage lines say is where the built model's variables are."""
    from trainer.loop.build import build
    from trainer.step.core import spread

    config = make_config(towers={"pipeline_stages": 2}, loop={"train_steps": 2, "log_every_steps": 2})
    metrics = train(config)
    out = capsys.readouterr().out
    assert "0.58 MB of variables on each stage's device; float32" in out and "towers " not in out
    assert (
        "pipelines  1 of 2 stages (sync, deterministic; 1f1b schedule): "
        "pipeline 0 tower 0 (/device:CPU:0) -> tower 1 (/device:CPU:1)\n"
    ) in out
    assert "stage 0    layers conv1..bn2 (5 layers), 0.07 MB of variables on /device:CPU:0\n" in out
    assert "stage 1    layers relu2..logits (7 layers), 0.51 MB of variables on /device:CPU:1\n" in out
    assert metrics["parameter_devices"] == [f"/job:localhost/replica:0/task:0/device:CPU:{s}" for s in (0, 1)]
    built = build(dataclasses.replace(config, loop=dataclasses.replace(config.loop, model_dir=str(tmp_path / "b"))))
    for stage, device in enumerate(["device:CPU:0", "device:CPU:1"]):
        owned = built.updater.runner.stage_variables(stage)
        assert owned and {spread.device_of(v).rsplit("/", 1)[-1] for v in owned} == {device}
    built.updater.close()


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
    say what the run actually trained on (the digits: ~90 KB decoded, so cached). One tower: what auto resolves
    to does not depend on the towers, and resnet20 is traced for one tower, not two."""
    metrics = train(make_config(model={"name": model}, towers={"num_towers": 1}, loop={"train_steps": 2}))
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


# TensorFlow 2.21's lines as a healthy job of two tasks printed them (TF_CPP_MIN_LOG_LEVEL=1), and one that is not
# harmless: what trainer.system.console must drop, and what it must keep.
CUINIT = (
    "E0000 00:00:1795681227.562792   27351 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
    "Failed call to cuInit: UNKNOWN ERROR (303)\n"
)
NODEDEF = (
    "E0000 00:00:1795681243.696138   27351 node_def_util.cc:682] NodeDef mentions attribute use_unbounded_threadpool "
    "which is not in the op definition: Op<name=MapDataset; signature=input_dataset:variant, other_arguments: -> "
    "handle:variant; attr=f:func> This may be expected if your graph generating binary is newer  than this binary. "
    "Unknown attributes will be ignored. NodeDef: {{node ParallelMapDatasetV2/_24}}\n"
)
HANDLE_CACHE = (
    "E0000 00:00:1795681245.514664   27919 function_handle_cache.cc:31] Failed to clear function handle cache: "
    "UNIMPLEMENTED: Releasing a multi-device component handle on a remote device is not yet implemented.\n"
)
TYPE_INFERENCE = [
    "W0000 00:00:1795681243.753516   27351 type_inference.cc:340] Type inference failed. This indicates an invalid "
    "graph that escaped type checking. Error message: INVALID_ARGUMENT: expected a subtype of goo.gle/debugonly   \n",
    "type_id: TFT_TENSOR\n", "args {\n", "  type_id: TFT_INT32\n", "}\n",
    " for input 2 of a homogeneous container 1001, got goo.gle/debugonly   \n",
    "type_id: TFT_SHAPE_TENSOR\n", "args {\n", "  type_id: TFT_INT32\n", "}\n", "\n",
    "\twhile inferring type of node 'map/while/body/_1/map/while/TensorArrayV2Write_1/TensorListSetItem'\n",
]  # fmt: skip
RENDEZVOUS = (
    "W0000 00:00:1795685132.459914    8506 local_rendezvous.cc:412] Local rendezvous is aborting with status: "
    "ABORTED: Cleanup -5543426334547564496 [type.googleapis.com/tensorflow.DerivedStatus='']\n"
)
REAL = "E0000 00:00:1795681245.514664   27919 grpc_util.cc:50] UNAVAILABLE: Connection reset by peer\n"


@pytest.mark.quick
@pytest.mark.parametrize("level", [1, 2])
def test_the_known_harmless_lines_are_dropped_and_a_real_error_is_kept(level):
    lines = [CUINIT, "step 1/6\n", NODEDEF, *TYPE_INFERENCE, "error: a real one\n", REAL, HANDLE_CACHE]
    lines += [RENDEZVOUS, "done\n"]
    assert list(console.kept(lines, level)) == ["step 1/6\n", "error: a real one\n", REAL, "done\n"]
    assert list(console.kept(lines, 0)) == lines  # -v: everything


@pytest.mark.quick
def test_every_harmless_line_is_documented_and_matches_what_tensorflow_printed():
    doc = (ROOT_PATH / "docs" / "console.md").read_text()
    printed = [CUINIT, NODEDEF, HANDLE_CACHE, TYPE_INFERENCE[0], RENDEZVOUS]
    assert [console._harmless(line) for line in printed] == list(console.HARMLESS)
    for harmless in console.HARMLESS:
        assert f"`{harmless.says.split(':')[0].replace(chr(92), '')}" in doc, harmless.says  # its words, unescaped


@pytest.mark.quick
def test_sentencepieces_own_lines_are_dropped_below_the_threshold_as_tensorflows_are():
    """tensorflow_text's SentencePiece prints `normalizer.cc(51) LOG(INFO) ...` loading a subword model: an INFO
    line (documented), dropped from level 1; its ERROR line shows at levels 1 and 2, as TensorFlow's would."""
    info = "normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty. use identity normalization.\n"
    error = "model_interface.cc(91) LOG(ERROR) a real one\n"
    assert [list(console.kept([info, error, "step 1/6\n"], level)) for level in (0, 1, 2, 3)] == [
        [info, error, "step 1/6\n"],
        [error, "step 1/6\n"],
        [error, "step 1/6\n"],
        ["step 1/6\n"],
    ]
    assert info.split(" use")[0] in (ROOT_PATH / "docs" / "console.md").read_text().replace("\n", " ")


@pytest.mark.quick
def test_a_message_that_does_not_go_on_as_the_harmless_one_does_is_shown_whole():
    cut_in = [*TYPE_INFERENCE[:4], "error: another thread's\n", *TYPE_INFERENCE[4:]]  # cannot be part of it
    assert list(console.kept(cut_in, 2)) == cut_in[:5] + TYPE_INFERENCE[4:]
    endless = [TYPE_INFERENCE[0], *["}\n"] * console.MESSAGE_LINES_MAX, "after\n"]
    assert list(console.kept(endless, 2)) == endless
    assert list(console.kept(TYPE_INFERENCE[:3], 2)) == TYPE_INFERENCE[:3]  # the stream ended inside it


@pytest.mark.quick
def test_the_filter_process_passes_lines_as_they_come_and_everything_left_when_the_task_is_killed(tmp_path):
    """A task that filters its stderr from now on writes a harmless line, a real one, waits, then dies of
    SIGKILL: the real line is out before the task dies, and nothing it wrote is lost."""
    first, last = CUINIT + "error: first\n", HANDLE_CACHE + REAL
    script = f"""
import os, sys, time
from trainer.system import console
console.filter_from_now(2)
os.write(2, {first!r}.encode())
time.sleep(3)
os.write(2, {last!r}.encode())
os.kill(os.getpid(), 9)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT_PATH)}
    task = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, env=env)
    started = time.monotonic()
    assert task.stderr.readline() == b"error: first\n" and time.monotonic() - started < 3  # live, not at the end
    assert task.stderr.read() == REAL.encode()  # to the end of the stream: the filter outlived the task
    assert task.wait() == -9
