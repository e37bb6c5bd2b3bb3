"""Text -> token records for the language model (`tasks.lm`), and the default corpus.

The text (files concatenated, UTF-8) is split nanoGPT's way: the first (1 - eval_fraction) of it is train and
the rest eval, counted in characters (`char` tokens) or bytes (`byte` and `subword` tokens; for subword the
cut moves forward to a character's first byte). Tokens: `byte` is the UTF-8 bytes (vocabulary 256); `char` is
the sorted set of the whole text's characters (nanoGPT's 65 for Shakespeare); `subword` the ids of a
SentencePiece model (BPE or unigram, `vocab_size` ids) trained on the train split (data/subword.py).
Each record holds one int64 list `tokens`:

- documents "none": consecutive windows of context + 1 tokens with stride context, so every token but a
  split's first is a target exactly once per epoch; the last window is kept short (records have 2 to
  context + 1 tokens);
- documents "paragraphs": one record per paragraph (split at blank lines), a paragraph longer than
  context + 1 cut into windows the same way; a paragraph of one token (nothing to predict) is dropped.

OUT holds train-0000i-of-0000N.tfrecord (up to TRAIN_SHARDS files, records dealt contiguously),
eval-00000-of-00001.tfrecord, vocab.json (`write_text_records`, below) and, for subword tokens, the model
(subword.model). The files are streamed (data/text_write.py): memory stays bounded whatever their size. The
default corpus is Python's own `pydoc_data/topics.py` (~465 K characters of documentation prose), present
wherever Python is.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import tempfile

from data.schema import DataError

TOKENS = ("char", "byte", "subword")
DOCUMENTS = ("none", "paragraphs")
TRAIN_SHARDS = 4
VOCAB_FILE = "vocab.json"
TOKENS_KEY = "tokens"
CACHE_VERSION = "v1"  # bump when the records written for the same text and settings change


def write_text_records(
    paths: list[str],
    out_dir: str,
    tokens: str,
    context: int,
    eval_fraction: float = 0.1,
    documents: str = "none",
    vocab_size: int | None = None,
    subword_model: str = "bpe",
    progress=None,
) -> tuple[str, str, str]:
    """Writes the records of the files' text into out_dir (see the module docstring), streaming: memory stays
    bounded whatever the files' size (data/text_write.py).

    Args:
        paths: UTF-8 text files, concatenated in this order.
        out_dir: Made if missing; files already there are overwritten. Nothing in it changes on an error.
        tokens: "char", "byte" or "subword".
        context: Tokens the model sees; records hold up to context + 1 (the inputs and their targets).
        eval_fraction: The share of the text (at its end) held out for eval, in (0, 1).
        documents: "none" (windows over the whole split) or "paragraphs".
        vocab_size: The subword vocabulary's size (subword tokens only).
        subword_model: "bpe" or "unigram" (subword tokens only).
        progress: A stream to show each pass's progress on (`data.phase`: `python -m data.prepare` passes
            stderr), or None.

    Returns:
        (train_glob, eval_glob, vocab_path).

    Raises:
        DataError: For an unreadable or non-UTF-8 file, a split with fewer than 2 tokens, or a vocab_size the
            text cannot fill or is too small for.
    """
    from data import text_stream, text_write

    options = {
        "train_shards": TRAIN_SHARDS,
        "vocab_file": VOCAB_FILE,
        "vocab_size": vocab_size,
        "subword_model": subword_model,
        "piece_bytes": text_stream.PIECE_BYTES,
        "progress": progress,
    }
    info = text_write.write(paths, out_dir, tokens, context, eval_fraction, documents, options)
    files = info["files"]
    return (
        os.path.join(out_dir, files["train"]),
        os.path.join(out_dir, files["eval"]),
        os.path.join(out_dir, VOCAB_FILE),
    )


def write_records(
    text: str,
    out_dir: str,
    tokens: str,
    context: int,
    eval_fraction: float,
    documents: str,
    vocab_size: int | None = None,
) -> tuple[str, str, str]:
    """`write_text_records` of a text already in memory (the default corpus), through a temporary file."""
    with tempfile.TemporaryDirectory(prefix="towerflow-text-") as scratch:
        path = os.path.join(scratch, "text.txt")
        with open(path, "wb") as f:
            f.write(text.encode("utf-8"))
        return write_text_records([path], out_dir, tokens, context, eval_fraction, documents, vocab_size)


def _pattern(split: str, num_shards: int) -> str:
    return f"{split}-*-of-{num_shards:05d}.tfrecord"


def read_vocab(path: str) -> dict:
    """vocab.json, checked: `tokens` char, byte or subword, `chars` (char) a list of distinct characters,
    `context`; for subword tokens the model file beside it (`model_file`, its `model_sha256` and `vocab_size`),
    whose bytes are added as `model_proto`.

    Raises:
        DataError: Naming the file, when it is missing, not JSON or lacks those keys, or the subword model is
            missing, changed or not a SentencePiece model.
    """
    rewrite = "write the records with `python -m data.prepare text`"
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except OSError as e:
        raise DataError(f"language-model vocabulary {path}: {e.strerror}; {rewrite}") from None
    except ValueError as e:
        raise DataError(f"language-model vocabulary {path} is not JSON ({e}); re{rewrite[1:]}") from None
    chars = info.get("chars") if isinstance(info, dict) else None
    valid = isinstance(info, dict) and info.get("tokens") in TOKENS and isinstance(info.get("context"), int)
    if valid and info["tokens"] == "char":
        valid = isinstance(chars, list) and all(isinstance(c, str) and len(c) == 1 for c in chars)
        valid = valid and len(set(chars)) == len(chars) > 0
    if valid and info["tokens"] == "subword":
        fields = (info.get("model_file"), info.get("model_sha256"), info.get("vocab_size"))
        valid = isinstance(fields[0], str) and isinstance(fields[1], str) and isinstance(fields[2], int)
        valid = valid and os.path.basename(fields[0]) == fields[0]
    if not valid:
        raise DataError(
            f"language-model vocabulary {path} lacks a valid 'tokens', 'chars', 'model_file' or 'context'; "
            f"re{rewrite[1:]}"
        )
    if info["tokens"] == "subword":
        _read_subword(path, info)
    return info


def _read_subword(path: str, info: dict) -> None:
    from data import subword

    model_path = os.path.join(os.path.dirname(path), info["model_file"])
    info["model_proto"] = subword.read_model(model_path, info["model_sha256"])
    size = subword.processor(info["model_proto"]).get_piece_size()
    if size != info["vocab_size"]:
        raise DataError(f"subword model {model_path} has {size} tokens, not {info['vocab_size']} as {path} says")


def default_corpus() -> tuple[str, str]:
    """Python's `pydoc_data.topics.topics` values, joined in sorted key order with blank lines.

    Returns:
        (text, sha256 hex of its UTF-8 bytes). The text differs between Python versions; the hash says which.
    """
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[key] for key in sorted(topics))
    return text, hashlib.sha256(text.encode("utf-8")).hexdigest()


def ensure_default_lm_data(
    context: int, tokens: str, cache_dir: str | None = None, vocab_size: int | None = None
) -> tuple[str, str, str]:
    """The default corpus's records, built on first use in a cache directory named by context, tokens and the
    corpus's sha256 (another Python's corpus gets its own), moved into place whole as `data.ensure_digits` does.

    Args:
        context: Tokens the model sees (records of up to context + 1).
        tokens: "char", "byte" or "subword" (then `vocab_size` ids, a BPE model trained on the train split).
        cache_dir: The parent directory; None means $TOWERFLOW_CACHE, else ~/.cache/towerflow.
        vocab_size: The subword vocabulary's size (subword tokens only; part of the directory's name).

    Returns:
        (train_glob, eval_glob, vocab_path).

    Raises:
        DataError: If the directory exists but is not a complete set of records (delete it to rebuild).
    """
    text, sha256 = default_corpus()
    root = (
        cache_dir or os.environ.get("TOWERFLOW_CACHE") or os.path.expanduser(os.path.join("~", ".cache", "towerflow"))
    )
    kind = f"{tokens}{vocab_size}" if vocab_size else tokens
    target = os.path.abspath(os.path.join(root, f"lm-pydoc-{kind}-c{context}-{sha256[:16]}-{CACHE_VERSION}"))
    if not _is_complete(target):
        os.makedirs(root, exist_ok=True)
        building = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.building-", dir=root)
        try:
            os.chmod(building, 0o755)  # mkdtemp makes it private; the cache may be shared
            write_records(text, building, tokens, context, 0.1, "none", vocab_size)
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
