"""`python -m trainer` end to end: flags.txt reproduces the run bitwise, the command line wins over a
flagfile, --help lists towerflow's flags by topic, and TensorFlow's own log lines stay off the console
unless -v asks for them."""

import json
import os
import platform
import re
import tempfile

import pytest
from absl import flags

from tests.support.runs import run_trainer
from trainer import cli
from trainer.settings import flags as tf_flags

# What TF 2.21 writes on a CPU-only machine: absl's banner, `I0000 ... port.cc] oneDNN ...`,
# `I0000 ... cudart_stub.cc] Could not find cuda drivers`, `I0000 ... cpu_feature_guard.cc] ...` and
# `E0000 ... cuda_platform.cc] failed call to cuInit: ... (303)`.
TF_NOISE = re.compile(r"cuInit|I0000|E0000|W0000|oneDNN|cpu_feature_guard|absl::InitializeLog")
TF_LOG_LINE = re.compile(r"^[IWEF]\d{4} .*\] ", re.MULTILINE)
VERSION_KEYS = ("towerflow", "tensorflow", "keras", "python", "numpy")


def _run(*args, expect=0, native_env=False):
    """Runs the trainer; `native_env`: without the test session's TF_CPP_MIN_LOG_LEVEL and
    CUDA_VISIBLE_DEVICES, as a user's shell would have it. Every run leaves its temporary directory empty:
    autograph's generated sources were left there (the trainer leaves through os._exit, past their clean-up),
    7 files in a 12-step run, until the input pipelines were built without autograph (trainer.system.graphs)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    if native_env:
        env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES")}
    with tempfile.TemporaryDirectory() as temp:
        result = run_trainer(*args, env={**env, "TMPDIR": temp})
        assert result.returncode == expect, result.stderr[-3000:]
        assert os.listdir(temp) == []
    return result


def _files(directory):
    return {
        os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns for d, _, files in os.walk(directory) for f in files
    }


def test_flagfile_reproduces_the_run(tmp_path):
    first = tmp_path / "first"
    result = _run(
        "--device=cpu",
        "--num_gpus=2",
        "--micro_batches=4",
        "--global_batch_size=64",
        "--deterministic",
        "--seed=7",
        "--train_steps=8",
        "--log_every_steps=4",
        "--eval_every_steps=0",
        "--noexport",
        f"--model_dir={first}",
        native_env=True,
    )
    noise = [line for line in (result.stderr + result.stdout).splitlines() if TF_NOISE.search(line)]
    assert not noise, noise
    flags_text = (first / "flags.txt").read_text()
    assert "--seed=7\n" in flags_text and "--deterministic\n" in flags_text and "--micro_batches=4\n" in flags_text
    for key in VERSION_KEYS:
        assert re.search(rf"^# {key} \d+\.\d+", flags_text, re.MULTILINE), (key, flags_text[:400])
    assert "# devices: 2 cpu tower(s)" in flags_text
    before = _files(first)
    again = tmp_path / "again"
    # the command line wins over the flagfile's --model_dir, although the flagfile comes after it
    result = _run(f"--model_dir={again}", f"--flagfile={first / 'flags.txt'}")
    assert "step       8/8" in result.stdout
    assert _files(first) == before
    a = json.loads((first / "metrics.json").read_text())
    b = json.loads((again / "metrics.json").read_text())
    assert (a["global_step"], a["num_towers"], a["micro_batches"]) == (8, 2, 4)
    assert a["weights_sha256"] == b["weights_sha256"]
    assert a["eval_loss"] == b["eval_loss"]
    assert a["devices"] == [
        {"device": f"/device:CPU:{i}", "task": 0, "tower": i, "pipeline": i, "stage": 0, "shards": [0]} for i in (0, 1)
    ]
    assert sorted(a["versions"]) == sorted(VERSION_KEYS) and a["versions"]["python"] == platform.python_version()
    # the versions header does not make a resume from the run's own flags.txt look changed
    result = _run(f"--flagfile={first / 'flags.txt'}", "--train_steps=10")
    assert "resumed" in result.stdout and "step      10/10" in result.stdout, result.stdout


@pytest.mark.quick
def test_command_line_flags_win_over_flagfiles(tmp_path):
    tf_flags.define_flags()
    inner, outer = tmp_path / "inner.txt", tmp_path / "outer.txt"
    inner.write_text("# a comment\n--seed=3\n--model_dir=/inner\n")
    outer.write_text(f"--model_dir=/outer\n--flagfile={inner}\n--num_gpus=4\n")
    argv = cli.command_line(["prog", "--seed", "9", "--flagfile", str(outer), "-v", "--", "x"], flags.FLAGS)
    from_files = ["--model_dir=/outer", "--seed=3", "--model_dir=/inner", "--num_gpus=4"]  # nested: in place
    assert argv == ["prog", *from_files, "--seed", "9", "--verbosity=1", "--", "x"]
    assert cli.command_line(["prog", "-v", "2"], flags.FLAGS) == ["prog", "-v", "2"]


@pytest.mark.quick
@pytest.mark.parametrize("arg", ["--help", "-h"])
def test_help_lists_our_flags_by_topic(arg):
    out = _run(arg).stdout
    assert out.startswith("usage: python -m trainer")
    headings = [line.split(":")[0] for line in out.splitlines()[1:] if re.match(r"^\w[\w ]*: ", line)]
    expected = ["towers", "pipeline", "data", "augmentation", "task", "model", "optimizer", "loop and outputs"]
    assert headings[:11] == [*expected, "resume", "cluster", "runtime"]
    towers = out[out.index("\ntowers:") : out.index("\npipeline:")]
    assert "--[no]pipeline_remat  (default: false)" in out[out.index("\npipeline:") : out.index("\ndata:")]
    optimizer = out[out.index("\noptimizer:") : out.index("\nloop and outputs:")]
    assert "--num_gpus=INT  (default: 1)" in towers and "--learning_rate=FLOAT  (default: 0.05)" in optimizer
    assert "--logtostderr" not in out and "--[no]export  (default: true)" in out
    assert "--augment=" in out[out.index("\naugmentation:") : out.index("\ntask:")]
    assert "--lm_context=INT  (default: 64)" in out[out.index("\ntask:") : out.index("\nmodel:")]


@pytest.mark.quick
def test_helpfull_lists_absl_flags_too():
    out = _run("--helpfull").stdout
    assert "--[no]logtostderr" in out and "--num_gpus" in out


def _too_many_gpus(model_dir, *verbosity):
    """A run that imports TensorFlow, then fails on our own check (exit 2): no training needed."""
    return _run("--device=gpu", "--num_gpus=64", f"--model_dir={model_dir}", *verbosity, expect=2, native_env=True)


@pytest.mark.quick
def test_tensorflow_logs_are_quiet_but_our_errors_are_not(tmp_path):
    result = _too_many_gpus(tmp_path)
    assert "error: --num_gpus=64 asks for 64 GPU towers" in result.stderr
    noise = [line for line in (result.stderr + result.stdout).splitlines() if TF_NOISE.search(line)]
    assert not noise, noise


@pytest.mark.parametrize("verbosity", [["-v"], ["--verbosity=1"], ["--verbosity", "0"]])
def test_verbosity_shows_tensorflow_logs(tmp_path, verbosity):
    result = _too_many_gpus(tmp_path, *verbosity)
    assert TF_LOG_LINE.search(result.stderr), result.stderr[-2000:]
    assert "error: --num_gpus=64 asks for 64 GPU towers" in result.stderr
