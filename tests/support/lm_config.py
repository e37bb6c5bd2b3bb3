"""A language-model task's run config over a vocab.json written beside an empty train file: for the tests that
build `tasks.lm.LanguageModel` without records (tests/tasks/test_lm.py, test_lm_sample.py)."""

from __future__ import annotations

import json
import types

from trainer.settings import config as cfg

CHARS = ["\n", " ", "a", "b", "é", "€", "😀"]  # UTF-8 lengths 1, 1, 1, 1, 2, 3, 4


def lm_config(tmp_path, chars=CHARS, tokens="char", context=8, **task):
    """A run config with what the task reads (its arguments in `task.option_dict`), over a vocab.json written next
    to a train file."""
    (tmp_path / "train-00000-of-00001.tfrecord").write_bytes(b"")
    vocab = {"tokens": tokens, "context": context, "source_sha256": "ab" * 32}
    if tokens == "char":
        vocab["chars"] = chars
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    options = dict(layers=1, heads=2, width=8, context=context, positions="learned", dropout=0.0) | task
    return types.SimpleNamespace(
        task=types.SimpleNamespace(option_dict=options),  # the task's own arguments (tasks.lm_options)
        towers=cfg.TowerConfig(),  # --tensor_shards (1): the model in one piece
        data=types.SimpleNamespace(train_data=str(tmp_path / "train-*")),
        seed=0,
    )
