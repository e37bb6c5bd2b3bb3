"""Fixtures of the task tests."""

from __future__ import annotations

import pytest

from tests.support.runs import trained_lm_run


@pytest.fixture(scope="session")
def subword_lm_run(tmp_path_factory):
    """Subword records (vocabulary 400) of the default corpus's first 40,000 characters and a run of 3 steps
    with its export (`root/records`, `root/run`): one run for the modules that read one (test_lm_subword,
    test_lm_generate)."""
    root = tmp_path_factory.mktemp("lm_subword")
    return trained_lm_run(root, "subword", "--vocab_size=400", chars=40_000, steps=3, batch=16)
