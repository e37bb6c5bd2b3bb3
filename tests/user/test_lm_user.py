"""The language-model user of issue #54: a corpus of their own outside the repository (Python source files, as
the Python standard library's were), driven by the commands README.md and docs/tasks.md give, from that
directory, as they would: prepare subword records from a quoted glob, train on 2 towers with eval and export,
sample, resume. Their mistakes are one line each, exit 2, nothing lost: eval records of another vocabulary
(refused before the first step, naming both folders), a directory given as the corpus, a sample far too long.
Every console shows progress and holds no line that is not towerflow's.

Eight processes; about 1.5 minutes on 2 idle cores.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from tests.support.console import foreign_lines
from tests.support.runs import LM_SIZES, trainer_command

# No PYTHONPATH: the user's directory is the working directory, towerflow is found by its install.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"CUDA_VISIBLE_DEVICES": ""}
CORPUS_FILES = ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py", "colorsys.py")
TRAIN = ("--task=lm", "--device=cpu", "--num_gpus=2", "--global_batch_size=16", *LM_SIZES)


def _run(project, *argv, timeout=600):
    return subprocess.run(argv, cwd=project, env=ENV, capture_output=True, text=True, timeout=timeout)


def _prepare(project, out, vocab_size):
    return _run(
        project, sys.executable, "-m", "data.prepare", "text", "corpus/**/*.py", out,
        "--tokens=subword", f"--vocab_size={vocab_size}", "--context=32",
    )  # fmt: skip


def _train(project, model_dir, steps, eval_folder="records"):
    data = ("--train_data=records/train-*", f"--eval_data={eval_folder}/eval-*")
    return _run(project, *trainer_command(*TRAIN, *data, f"--train_steps={steps}", f"--model_dir={model_dir}"))


def _sample(project, *flags):
    return _run(project, sys.executable, "-m", "tasks.sample", "runs/lm", "--prompt=def ", "--seed=1", *flags)


def _refused(done) -> str:
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-3000:]
    return lines[0]


def _tree_sha256(folder) -> str:
    digest = hashlib.sha256()
    for root, _, names in sorted(os.walk(folder)):
        for name in sorted(names):
            path = os.path.join(root, name)
            digest.update(path.encode() + pathlib.Path(path).read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The user's directory: `corpus/` (seven modules of the standard library, one in a subfolder), the
    records prepared from it at 500 and at 400 subword tokens, and a 4-step run on 2 towers (`runs/lm`)."""
    project = tmp_path_factory.mktemp("lm_user")
    stdlib = os.path.dirname(os.__file__)
    (project / "corpus" / "more").mkdir(parents=True)
    for i, name in enumerate(CORPUS_FILES):
        shutil.copy(os.path.join(stdlib, name), project / "corpus" / ("more" if i % 3 == 2 else "") / name)
    consoles = {"prepare": _prepare(project, "records", 500), "prepare400": _prepare(project, "records400", 400)}
    consoles["train"] = _train(project, "runs/lm", 4)
    return project, consoles


@pytest.mark.parametrize("command", ["prepare", "prepare400", "train"])
def test_each_command_succeeds_showing_its_phases_and_only_towerflows_lines(project, command):
    _, consoles = project
    done = consoles[command]
    assert done.returncode == 0, done.stderr[-3000:]
    assert foreign_lines(done.stdout, done.stderr) == []
    if command == "train":
        assert done.stderr == ""
        for line in ("eval at step 4: loss", "exported to export/4", "done: step 4"):
            assert line in done.stdout, done.stdout[-3000:]
    else:  # what was written, in how long (a pass that runs over 10 s is shown as it runs: test_text_data)
        assert done.stderr.startswith("wrote ") and " subword tokens from 7 files " in done.stderr, done.stderr
        assert "--train_data=" in done.stdout and "--eval_data=" in done.stdout, done.stdout


def test_the_glob_reads_every_file_and_the_run_records_its_model(project):
    root, consoles = project
    vocab = json.loads((root / "records" / "vocab.json").read_text())
    assert (vocab["tokens"], vocab["vocab_size"]) == ("subword", 500)
    paths = sorted(glob.glob(str(root / "corpus" / "**" / "*.py"), recursive=True))
    text = b"".join(pathlib.Path(path).read_bytes() for path in paths)
    assert len(paths) == len(CORPUS_FILES) and "from 7 files" in consoles["prepare"].stderr
    assert vocab["bytes"]["train"] + vocab["bytes"]["eval"] == len(text)
    assert vocab["source_sha256"] == hashlib.sha256(text).hexdigest()
    metrics = json.loads((root / "runs" / "lm" / "metrics.json").read_text())
    assert (metrics["global_step"], metrics["task"]) == (4, "lm")
    assert metrics["model"].startswith("transformer (1 layer, 2 heads, width 16, context 32")
    assert [d["tower"] for d in metrics["devices"]] == [0, 1]


def test_eval_records_of_another_vocabulary_are_refused_before_the_first_step(project):
    root, _ = project
    line = _refused(_train(root, "runs/wrong", 4, eval_folder="records400"))
    assert "records/vocab.json says subword tokens, 500 of them" in line, line
    assert "records400/vocab.json says subword tokens, 400 of them" in line, line
    assert not (root / "runs" / "wrong" / "checkpoints").exists()


def test_a_directory_as_the_corpus_is_one_line_suggesting_its_files(project):
    root, _ = project
    done = _run(root, sys.executable, "-m", "data.prepare", "text", "corpus", "records_dir", "--tokens=byte")
    assert _refused(done) == (
        "error: text file corpus is a directory: give its files, e.g. 'corpus/**/*.py' (in quotes: expanded here, "
        "recursively, in sorted order)"
    )
    assert not (root / "records_dir").exists()


def test_sampling_streams_the_same_text_for_the_same_seed_and_refuses_too_long(project):
    root, _ = project
    first, again = _sample(root, "--tokens=24"), _sample(root, "--tokens=24")
    assert first.returncode == 0 and first.stderr == "", first.stderr[-3000:]
    assert first.stdout == again.stdout and first.stdout.startswith("def ") and len(first.stdout) > len("def ")
    line = _refused(_sample(root, "--tokens=1000000"))
    assert "--tokens" in line and "100000" in line.replace(",", ""), line


def test_a_resume_continues_the_run_and_a_refused_one_loses_nothing(project):
    root, _ = project
    shutil.copytree(root / "runs" / "lm", root / "runs" / "resumed")
    before = _tree_sha256(root / "runs" / "resumed" / "checkpoints")
    line = _refused(_run(root, *trainer_command(
        *TRAIN, "--train_data=records400/train-*", "--eval_data=records400/eval-*", "--train_steps=6",
        "--model_dir=runs/resumed")))  # fmt: skip
    assert "its weights are for another vocabulary" in line and "Cg4K" not in line, line
    assert _tree_sha256(root / "runs" / "resumed" / "checkpoints") == before
    done = _train(root, "runs/resumed", 6)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
    assert "resumed from" in done.stdout and "at step 4" in done.stdout, done.stdout[-3000:]
    assert json.loads((root / "runs" / "resumed" / "metrics.json").read_text())["global_step"] == 6
