"""Corrupting a file the run wrote never makes a crash loop (issue #20): the rerun either goes on to the weights
of an uninterrupted run, or stops with exit 2 and one line naming the file, and deleting that file lets the
next rerun reach those weights. A seeded sample, one trial or two per file kind (`tests/support/corrupt_trials.py`
has the harness; `python -m tests.support.corrupt_trials --trials=200` runs many). Event files are left out: a torn
or damaged event file is another change's (TensorBoard's purge on resume reads them)."""

import random

import pytest

from tests.support import corrupt_trials as ct

SAMPLE = [  # (file kind, scenario, damage)
    ("checkpoint_data", "resume", "truncate"),
    ("checkpoint_index", "resume", "flip"),
    ("state_file", "resume", "flip"),
    ("attempts", "resume", "truncate"),
    ("metrics", "finished", "truncate"),  # unreadable: evaluated again
    ("metrics", "finished", "flip"),
    ("run_json", "resume", "zero"),  # exit 2 naming run.json
    ("flags_txt", "resume", "flip"),
    ("flags_history", "finished", "append"),
]


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """(workdir, reference weights hash, scenario -> the interrupted run to copy), trained once."""
    workdir = tmp_path_factory.mktemp("corrupt")
    reference, runs = ct.prepare(str(workdir))
    return str(workdir), reference, runs


@pytest.mark.parametrize(("kind", "scenario", "mode"), SAMPLE)
def test_a_damaged_file_never_makes_a_crash_loop(bases, kind, scenario, mode):
    workdir, reference, runs = bases
    rng = random.Random(f"{kind}-{scenario}-{mode}")
    n = SAMPLE.index((kind, scenario, mode))
    trial = ct.trial(workdir, runs, reference, ct.Trial(kind, scenario, mode), rng, n)
    assert trial.outcome in ("a", "b"), trial
