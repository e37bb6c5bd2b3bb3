"""The language model on subword records (`python -m data.prepare text --tokens=subword`): a short run trains
and exports, bits per byte counts the bytes the subword targets stand for, and `python -m tasks.sample` decodes
the ids with the model the run directory carries."""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import math

import pytest
import tensorflow as tf

from data import subword
from tasks import sample

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


def test_the_sampler_decodes_subword_ids(run, capsys):
    argv = [str(run / "run"), "--prompt=The class ", "--tokens=12", "--seed=3"]
    assert sample.main(argv) == 0
    first = capsys.readouterr().out
    assert sample.main(argv) == 0
    assert capsys.readouterr().out == first and first.startswith("The class ")
    task = sample.read_vocabulary(str(run / "run"))
    assert sample.decode(sample.encode("naïve “text” ✓", task), task) == "naïve “text” ✓"  # byte fallback
