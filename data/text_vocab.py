"""What the vocab.json beside a set of token records says, read without TensorFlow or SentencePiece, so that
`python -m trainer` can compare the train and eval records' vocabularies, and their context with the model's,
before TensorFlow is imported (`tasks.lm_options`) and again where the language model reads them (`tasks.lm`).

A set of records is one `python -m data.prepare text` run's OUT: its train and eval records share one
vocabulary. Records of two runs, even of the same text and settings but another --vocab_size, number the
tokens differently: training on one and evaluating on the other gives figures that mean nothing.
"""

from __future__ import annotations

import glob
import json
import os

from data.text import VOCAB_FILE

_PREPARE = "prepare both from the same `python -m data.prepare text` run (its OUT/train-* and OUT/eval-*)"


def vocab_beside(pattern: str) -> tuple[str, dict] | None:
    """(path, contents) of the vocab.json beside the first file `pattern` (comma-separated local globs)
    matches, as `tasks.lm` finds it; None when there is none, it is not a JSON object, or the glob is remote."""
    parts = [p.strip() for p in pattern.split(",") if p.strip()]
    if not parts or any("://" in p for p in parts):
        return None
    files = sorted({m for p in parts for m in glob.glob(p, include_hidden=True) if os.path.isfile(m)})
    if not files:
        return None
    path = os.path.join(os.path.dirname(files[0]), VOCAB_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return (path, info) if isinstance(info, dict) and "tokens" in info else None


def describe(info: dict) -> str:
    """The vocabulary in words: 'subword tokens, 2000 of them (model sha256 1a2b3c4d5e6f)', 'byte tokens'."""
    tokens = info.get("tokens")
    if tokens == "char":
        return f"char tokens, {len(info.get('chars') or [])} characters"
    if tokens == "subword":
        return f"subword tokens, {info.get('vocab_size')} of them (model sha256 {str(info.get('model_sha256'))[:12]})"
    return f"{tokens} tokens"


def _identity(info: dict) -> tuple:
    return info.get("tokens"), info.get("vocab_size"), info.get("chars"), info.get("model_sha256")


def mismatch(train: tuple[str, dict], evaluation: tuple[str, dict] | None) -> str:
    """The problem, in one line, when the eval records' vocabulary is not the train records'; "" if it is (or
    the eval records have no vocab.json to compare)."""
    if evaluation is None or _identity(train[1]) == _identity(evaluation[1]):
        return ""
    (train_path, train_info), (eval_path, eval_info) = train, evaluation
    return (
        f"--train_data and --eval_data are records of different vocabularies: {train_path} says "
        f"{describe(train_info)}, {eval_path} says {describe(eval_info)}; {_PREPARE}"
    )


def context_problem(found: tuple[str, dict], context: int, flag: str = "--lm_context") -> str:
    """The problem when the records were written for a longer context than the model's, naming `flag`, where
    the model's context came from."""
    path, written = found[0], found[1].get("context")
    if not isinstance(written, int) or written <= context:
        return ""
    return (
        f"the records were written for context {written} ({path}), longer than the model's context {context} "
        f"({flag}): pass --lm_context={written}, or rewrite the records with `python -m data.prepare text "
        f"... --context={context}`"
    )


def context_warning(found: tuple[str, dict], context: int, flag: str = "--lm_context") -> str:
    """A warning when the records were written for a shorter context than the model's: it never sees a longer
    window, and its positions past the records' length are never trained."""
    path, written = found[0], found[1].get("context")
    if not isinstance(written, int) or written >= context:
        return ""
    return (
        f"warning: the records were written for context {written} ({path}) and the model's context is {context} "
        f"({flag}): it trains on windows of at most {written} tokens, positions past them never; rewrite "
        f"the records with `python -m data.prepare text ... --context={context}`, or pass --lm_context={written}"
    )
