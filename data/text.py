"""Text -> token records for the language model (`tasks.lm`), and the default corpus.

The text (files concatenated, UTF-8) is split nanoGPT's way: the first (1 - eval_fraction) of it is train and
the rest eval, counted in characters (`char` tokens) or bytes (`byte` tokens). Tokens: `byte` is the UTF-8
bytes (vocabulary 256); `char` is the sorted set of the whole text's characters (nanoGPT's 65 for Shakespeare).
Each record holds one int64 list `tokens`:

- documents "none": consecutive windows of context + 1 tokens with stride context, so every token but a
  split's first is a target exactly once per epoch; the last window is kept short (records have 2 to
  context + 1 tokens);
- documents "paragraphs": one record per paragraph (split at blank lines), a paragraph longer than
  context + 1 cut into windows the same way; a paragraph of one token (nothing to predict) is dropped.

OUT holds train-0000i-of-0000N.tfrecord (up to TRAIN_SHARDS files, records dealt contiguously),
eval-00000-of-00001.tfrecord and vocab.json (`write_text_records`, below). The default corpus is Python's own
`pydoc_data/topics.py` (~465 K characters of documentation prose), present wherever Python is.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import tempfile

from data.schema import DataError

TOKENS = ("char", "byte")
DOCUMENTS = ("none", "paragraphs")
TRAIN_SHARDS = 4
VOCAB_FILE = "vocab.json"
TOKENS_KEY = "tokens"
CACHE_VERSION = "v1"  # bump when the records written for the same text and settings change
_BLANK_LINE = r"\n(?:[ \t\r\f\v]*\n)+"  # one or more empty (or whitespace-only) lines between paragraphs


def read_text(paths: list[str]) -> str:
    """The files' text, concatenated in the order given.

    Raises:
        DataError: For a file that is missing or not UTF-8.
    """
    parts = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                parts.append(f.read().decode("utf-8"))
        except OSError as e:
            raise DataError(f"cannot read text file {path}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise DataError(f"text file {path} is not UTF-8 (byte {e.start}); convert it to UTF-8") from None
    return "".join(parts)


def vocabulary(text: str, tokens: str) -> list[str] | None:
    """The sorted characters of `text` for `char` tokens (a token is its index), None for `byte` tokens."""
    return sorted(set(text)) if tokens == "char" else None


def split_text(text: str, tokens: str, eval_fraction: float) -> tuple[str | bytes, str | bytes]:
    """(train, eval): the text (char) or its UTF-8 bytes (byte) cut at int(n * (1 - eval_fraction))."""
    units = text if tokens == "char" else text.encode("utf-8")
    cut = int(len(units) * (1.0 - eval_fraction))
    return units[:cut], units[cut:]


def token_records(units: str | bytes, chars: list[str] | None, context: int, documents: str) -> list[list[int]]:
    """One split's records: lists of 2..context+1 token ids (see the module docstring)."""
    index = {c: i for i, c in enumerate(chars)} if chars is not None else None
    pieces = [units] if documents == "none" else _paragraphs(units)
    records = []
    for piece in pieces:
        ids = [index[c] for c in piece] if index is not None else list(piece)
        records.extend(ids[start : start + context + 1] for start in range(0, len(ids) - 1, context))
    return records


def _paragraphs(units: str | bytes) -> list[str | bytes]:
    pattern = _BLANK_LINE if isinstance(units, str) else _BLANK_LINE.encode()
    return [piece for piece in re.split(pattern, units) if piece]


def write_text_records(
    paths: list[str], out_dir: str, tokens: str, context: int, eval_fraction: float = 0.1, documents: str = "none"
) -> tuple[str, str, str]:
    """Writes the records of the files' text into out_dir (see the module docstring).

    Args:
        paths: UTF-8 text files, concatenated in this order.
        out_dir: Made if missing; files already there are overwritten.
        tokens: "char" or "byte".
        context: Tokens the model sees; records hold up to context + 1 (the inputs and their targets).
        eval_fraction: The share of the text (at its end) held out for eval, in (0, 1).
        documents: "none" (windows over the whole split) or "paragraphs".

    Returns:
        (train_glob, eval_glob, vocab_path).

    Raises:
        DataError: For an unreadable or non-UTF-8 file, or a split with fewer than 2 tokens.
    """
    text = read_text(paths)
    return write_records(text, out_dir, tokens, context, eval_fraction, documents)


def write_records(
    text: str, out_dir: str, tokens: str, context: int, eval_fraction: float, documents: str
) -> tuple[str, str, str]:
    """`write_text_records` of a text already read; vocab.json is written last (it marks a complete dir)."""
    chars = vocabulary(text, tokens)
    splits = dict(zip(("train", "eval"), split_text(text, tokens, eval_fraction), strict=True))
    records = {name: token_records(units, chars, context, documents) for name, units in splits.items()}
    for name, units in splits.items():
        if not records[name]:
            raise DataError(
                f"the {name} split has {len(units)} {tokens}s, no record of 2 tokens or more: give more text "
                "or change --eval_fraction"
            )
    shards = {"train": min(TRAIN_SHARDS, len(records["train"])), "eval": 1}
    os.makedirs(out_dir, exist_ok=True)
    for name, split_records in records.items():
        _write_shards(os.path.join(out_dir, name), split_records, shards[name])
    info = {
        "tokens": tokens,
        **({"chars": chars} if chars is not None else {}),
        "vocab_size": len(chars) if chars is not None else 256,
        "source_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "train_tokens": len(splits["train"]),
        "eval_tokens": len(splits["eval"]),
        "bytes": {name: len(_as_bytes(units)) for name, units in splits.items()},
        "records": {name: len(split_records) for name, split_records in records.items()},
        "context": context,
        "documents": documents,
        "eval_fraction": eval_fraction,
        "files": {name: _pattern(name, count) for name, count in shards.items()},
    }
    vocab_path = os.path.join(out_dir, VOCAB_FILE)
    with open(vocab_path, "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1, ensure_ascii=False)
    return os.path.join(out_dir, info["files"]["train"]), os.path.join(out_dir, info["files"]["eval"]), vocab_path


def _as_bytes(units: str | bytes) -> bytes:
    return units.encode("utf-8") if isinstance(units, str) else units


def _pattern(split: str, num_shards: int) -> str:
    return f"{split}-*-of-{num_shards:05d}.tfrecord"


def _write_shards(prefix: str, records: list[list[int]], num_shards: int) -> None:
    """Records dealt contiguously: shard i holds [i*N//S, (i+1)*N//S), so the shards in order are the text's."""
    import tensorflow as tf  # only once the arguments and the text are known to be good

    # Private until data/'s writer of a task's records lands (data.write_feature_records); then use that.
    for shard in range(num_shards):
        path = f"{prefix}-{shard:05d}-of-{num_shards:05d}.tfrecord"
        begin, end = shard * len(records) // num_shards, (shard + 1) * len(records) // num_shards
        with tf.io.TFRecordWriter(path) as writer:
            for ids in records[begin:end]:
                feature = {TOKENS_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=ids))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def read_vocab(path: str) -> dict:
    """vocab.json, checked: `tokens` char or byte, `chars` (char) a list of distinct characters, `context`.

    Raises:
        DataError: Naming the file, when it is missing, not JSON or lacks those keys.
    """
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except OSError as e:
        raise DataError(
            f"language-model vocabulary {path}: {e.strerror}; write the records with `python -m data.prepare text`"
        ) from None
    except ValueError as e:
        raise DataError(
            f"language-model vocabulary {path} is not JSON ({e}); rewrite it with `python -m data.prepare text`"
        ) from None
    chars = info.get("chars") if isinstance(info, dict) else None
    valid = isinstance(info, dict) and info.get("tokens") in TOKENS and isinstance(info.get("context"), int)
    if valid and info["tokens"] == "char":
        valid = isinstance(chars, list) and all(isinstance(c, str) and len(c) == 1 for c in chars)
        valid = valid and len(set(chars)) == len(chars) > 0
    if not valid:
        raise DataError(
            f"language-model vocabulary {path} lacks a valid 'tokens', 'chars' or 'context'; rewrite "
            "it with `python -m data.prepare text`"
        )
    return info


def default_corpus() -> tuple[str, str]:
    """Python's `pydoc_data.topics.topics` values, joined in sorted key order with blank lines.

    Returns:
        (text, sha256 hex of its UTF-8 bytes). The text differs between Python versions; the hash says which.
    """
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[key] for key in sorted(topics))
    return text, hashlib.sha256(text.encode("utf-8")).hexdigest()


def ensure_default_lm_data(context: int, tokens: str, cache_dir: str | None = None) -> tuple[str, str, str]:
    """The default corpus's records, built on first use in a cache directory named by context, tokens and the
    corpus's sha256 (another Python's corpus gets its own), moved into place whole as `data.ensure_digits` does.

    Args:
        context: Tokens the model sees (records of up to context + 1).
        tokens: "char" or "byte".
        cache_dir: The parent directory; None means $TOWERFLOW_CACHE, else ~/.cache/towerflow.

    Returns:
        (train_glob, eval_glob, vocab_path).

    Raises:
        DataError: If the directory exists but is not a complete set of records (delete it to rebuild).
    """
    text, sha256 = default_corpus()
    root = (
        cache_dir or os.environ.get("TOWERFLOW_CACHE") or os.path.expanduser(os.path.join("~", ".cache", "towerflow"))
    )
    target = os.path.abspath(os.path.join(root, f"lm-pydoc-{tokens}-c{context}-{sha256[:16]}-{CACHE_VERSION}"))
    if not _is_complete(target):
        os.makedirs(root, exist_ok=True)
        building = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.building-", dir=root)
        try:
            os.chmod(building, 0o755)  # mkdtemp makes it private; the cache may be shared
            write_records(text, building, tokens, context, 0.1, "none")
            try:
                os.replace(building, target)
            except OSError as e:  # another process finished first: use its copy
                if not _is_complete(target):
                    raise DataError(f"language-model cache {target} is incomplete; delete it and retry") from e
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return (
        os.path.join(target, _pattern("train", TRAIN_SHARDS)),
        os.path.join(target, _pattern("eval", 1)),
        os.path.join(target, VOCAB_FILE),
    )


def _is_complete(directory: str) -> bool:
    return (
        os.path.isfile(os.path.join(directory, VOCAB_FILE))
        and len(glob.glob(os.path.join(directory, _pattern("train", TRAIN_SHARDS)))) == TRAIN_SHARDS
        and len(glob.glob(os.path.join(directory, _pattern("eval", 1)))) == 1
    )
