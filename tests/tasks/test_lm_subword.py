"""The language model on subword records (`python -m data.prepare text --tokens=subword`): a short run trains
and exports, bits per byte counts the bytes the subword targets stand for, and `python -m tasks.sample` decodes
the ids with the model the run directory carries."""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import math

import numpy as np
import pytest
import tensorflow as tf

from data import subword
from tasks import sample
from tests.support.console import foreign_lines

# The session's subword run (tests/tasks/conftest.py: records and a 3-step `python -m trainer` run with its
# export) is read here and by test_lm_generate's fresh-process test: in one xdist group, it is made once.
pytestmark = pytest.mark.xdist_group("subword_lm_run")


@pytest.fixture(scope="module")
def run(subword_lm_run):
    """Subword records (vocabulary 400) of the default corpus's first 40,000 characters, and a run of 3 steps
    (tests/tasks/conftest.py: the run test_lm_generate reads too)."""
    return subword_lm_run


def test_a_run_on_subword_records_counts_the_bytes_its_targets_stand_for(run):
    info = json.loads((run / "records" / "vocab.json").read_text())
    metrics = json.loads((run / "run" / "metrics.json").read_text())
    assert (metrics["global_step"], metrics["task"]) == (3, "lm")
    model = (run / "records" / "subword.model").read_bytes()
    ids = []
    for raw in tf.data.TFRecordDataset(sorted(glob.glob(str(run / "records" / "eval-*")))):
        tokens = tf.io.parse_single_example(raw, {"tokens": tf.io.VarLenFeature(tf.int64)})["tokens"]
        ids.append(tf.sparse.to_dense(tokens).numpy())
    targets = [t for record in ids for t in record[1:]]
    assert len(targets) == info["eval_tokens"] - 1
    target_bytes = subword.token_bytes(model)[targets].sum()
    assert target_bytes == info["bytes"]["eval"] - subword.token_bytes(model)[ids[0][0]]
    bits = metrics["eval_loss"] * len(targets) / math.log(2.0) / target_bytes
    assert metrics["eval_bits_per_byte"] == pytest.approx(bits, rel=1e-4)


def test_the_run_directory_and_export_carry_the_model(run):
    model = (run / "records" / "subword.model").read_bytes()
    recorded = json.loads((run / "run" / "run.json").read_text())
    assert (recorded["task.tokens"], recorded["task.vocab_size"]) == ("subword", 400)
    assert base64.b64decode(recorded["task.subword_model"]) == model
    assert recorded["task.subword_model_sha256"] == hashlib.sha256(model).hexdigest()
    contract_path = glob.glob(str(run / "run" / "export" / "*" / "assets.extra" / "towerflow_serving.json"))[0]
    with open(contract_path, encoding="utf-8") as f:
        contract = json.load(f)
    assert base64.b64decode(contract["subword_model"]) == model


def test_the_sampler_decodes_subword_ids(run, capfd):
    """Twice the same text; loading the export prints no line of its SentencePiece's (`normalizer.cc(51)
    LOG(INFO) precompiled_charsmap is empty`, filtered at the session's TF_CPP_MIN_LOG_LEVEL=1 as at the
    default 3; test_lm.py's fresh `python -m tasks.sample` shows TensorFlow's start-up lines gone too)."""
    argv = [str(run / "run"), "--prompt=The class ", "--tokens=12", "--seed=3"]
    assert sample.main(argv) == 0
    first = capfd.readouterr()
    assert first.err == ""
    assert sample.main(argv) == 0
    assert capfd.readouterr().out == first.out and first.out.startswith("The class ")
    task = sample.read_vocabulary(str(run / "run"))
    assert sample.decode(sample.encode("naïve “text” ✓", task), task) == "naïve “text” ✓"  # byte fallback


def test_the_sampler_streams_whole_characters_of_subword_pieces(run):
    """Byte pieces (byte fallback) are held until the piece that ends them: the streamed pieces, joined, are
    `decode` of every id, for any ids (random ones, byte pieces and <unk> among them)."""
    task = sample.read_vocabulary(str(run / "run"))
    size = task["processor"].get_piece_size()
    rng = np.random.default_rng(0)
    cases = [sample.encode("naïve “text” ✓ 𝄞", task)]
    # half of the ids byte pieces (ids 1..256 with byte fallback, `<unk>` at 0), half any piece
    cases += [np.where(rng.random(30) < 0.5, rng.integers(1, 257, 30), rng.integers(0, size, 30)).tolist()
              for _ in range(300)]  # fmt: skip
    for ids in cases:
        decoder = sample.Decoder(task)
        assert "".join([decoder.add(i) for i in ids] + [decoder.end()]) == sample.decode(ids, task), ids


def test_the_run_prints_only_towerflows_lines(run):
    """The run's console (tests/support/runs.py keeps it): no TensorFlow line, no SentencePiece
    `normalizer.cc(51) LOG(INFO)` line; stderr empty."""
    out, err = (run / "run.stdout").read_text(), (run / "run.stderr").read_text()
    assert foreign_lines(out, err) == [] and err == "", err[-2000:]
    assert "eval at step 3: loss" in out and "exported to export/3" in out


def test_records_of_another_vocabulary_are_refused_for_eval_and_for_a_resume(run, tmp_path):
    """The user of #54: train records of one vocabulary (400) with eval records of another (500) are one line
    naming both folders (exit 2, nothing trained); resuming the run on the other records names the data's facts
    in words, never the model's base64, and does not offer --allow_flag_changes, which could not load the
    weights (nor does it take it)."""
    import contextlib
    import io
    import os
    import shutil

    from data import prepare
    from tests.support.runs import LM_SIZES, run_trainer

    other = tmp_path / "other"
    argv = ["text", str(run / "text.txt"), str(other), "--context=32", "--tokens=subword", "--vocab_size=500"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert prepare.main(argv) == 0
    shutil.copytree(run / "run", tmp_path / "run")
    ours = [f"--train_data={run / 'records' / 'train-*'}", f"--eval_data={other / 'eval-*'}"]
    theirs = [f"--train_data={other / 'train-*'}", f"--eval_data={other / 'eval-*'}"]
    common = ["--device=cpu", "--task=lm", *LM_SIZES, "--train_steps=6", "--global_batch_size=16"]
    for data, model_dir, allow, words in (
        (
            ours,
            tmp_path / "fresh",
            [],
            (
                f"{run}/records/vocab.json says subword tokens, 400 of",
                f"{other}/vocab.json says subword tokens, 500 of",
            ),
        ),
        (theirs, tmp_path / "run", [], ("the data's vocab size: 400 -> 500): its weights are for another vocab",)),
        (theirs, tmp_path / "run", ["--allow_flag_changes"], ("its weights are for another vocabulary",)),
    ):
        done = run_trainer(*common, *data, f"--model_dir={model_dir}", *allow, env=dict(os.environ), timeout=300)
        lines = done.stderr.splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
        assert all(w in lines[0] for w in words), lines[0]
        assert "--allow_flag_changes" not in lines[0] and "Cg4K" not in lines[0], lines[0]
    assert not os.path.exists(tmp_path / "fresh" / "checkpoints")
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == sorted(os.listdir(run / "run" / "checkpoints"))
