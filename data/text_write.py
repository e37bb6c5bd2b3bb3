"""`data.text.write_text_records`, streamed: text files -> a directory of token records and vocab.json, with
memory bounded whatever the files' size (data/text.py says what is written; data/text_stream.py how the text
is read; data/text_records.py how records are cut and written; data/subword.py the subword tokens).

Passes over the files: one that checks and counts them (and collects the characters, for char tokens); for
subword tokens one that reads the sample the model trains on; one that writes. Everything is written into a
directory beside OUT and moved into OUT at the end, vocab.json last: a failure leaves OUT as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

import numpy as np

from data import subword, text_stream
from data.phase import shown
from data.schema import DataError
from data.text_records import Shards, Windows

SPLITS = ("train", "eval")


def write(paths, out_dir, tokens, context, eval_fraction, documents, options) -> dict:
    """Writes the records and vocab.json into out_dir; returns vocab.json's content.

    Args:
        options: {"train_shards", "vocab_file", "vocab_size", "subword_model", "piece_bytes"}, and "progress":
            the stream each pass shows its progress on (`data.phase`), or None.
    """
    size_mb = sum(os.path.getsize(path) for path in paths) / 1e6
    files = f"{len(paths)} file{'s' if len(paths) != 1 else ''}"
    with shown(f"reading {files}", options.get("progress"), total=size_mb, unit="MB") as phase:
        progress = lambda done: phase.update(done / 1e6)  # noqa: E731
        scanned = text_stream.scan(paths, tokens == "char", options["piece_bytes"], progress)
    cut = int((scanned.chars if tokens == "char" else scanned.bytes) * (1.0 - eval_fraction))
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    building = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out_dir))}.building-", dir=parent)
    try:
        info = _write_into(building, paths, scanned, cut, tokens, context, documents, options)
        shards = info.pop("shards")
        info.update(context=context, documents=documents, eval_fraction=eval_fraction)
        info["files"] = {name: f"{name}-*-of-{shards[name]:05d}.tfrecord" for name in SPLITS}
        with open(os.path.join(building, options["vocab_file"]), "w", encoding="utf-8") as f:
            json.dump(info, f, indent=1, ensure_ascii=False)
        os.makedirs(out_dir, exist_ok=True)
        for name in sorted(os.listdir(building), key=lambda n: n == options["vocab_file"]):  # vocab.json last
            os.replace(os.path.join(building, name), os.path.join(out_dir, name))
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return info


def _write_into(building, paths, scanned, cut, tokens, context, documents, options) -> dict:
    chars = sorted(scanned.charset) if tokens == "char" else None
    info = {"tokens": tokens, **({"chars": chars} if chars is not None else {})}
    stream = options.get("progress")
    if tokens == "subword":
        if cut == 0:  # said as byte and char tokens say it, not as SentencePiece's `!sentences_.empty()`
            raise DataError(_no_record("train", 0, "byte"))
        what = f"training a {options['subword_model']} model of {options['vocab_size']} subword tokens"
        with shown(what, stream, detail=f"on the train split's {cut / 1e6:,.1f} MB"):
            model = subword.train_apart(paths, cut, options["vocab_size"], options["subword_model"])
        name = subword.MODEL_FILE
        with open(os.path.join(building, name), "wb") as f:
            f.write(model)
        sha256 = hashlib.sha256(model).hexdigest()
        info.update(vocab_size=options["vocab_size"], subword_model=options["subword_model"])
        info.update(model_file=name, model_sha256=sha256)
        tokenize = subword.Encoder(model)
    else:
        info["vocab_size"] = len(chars) if chars is not None else 256
        tokenize = _char_ids(chars) if chars is not None else _byte_ids
    total = scanned.chars if tokens == "char" else scanned.bytes
    expected = {"train": _windows(cut, context), "eval": _windows(total - cut, context)}
    if documents != "none" or tokens == "subword":
        expected = {name: None for name in SPLITS}  # counted as they are written
    splits = _Splits(building, context, expected, options["train_shards"], tokenize)
    try:
        with shown(f"writing {tokens} records", stream, total=scanned.bytes / 1e6, unit="MB") as phase:
            for split, units, size in text_stream.split_pieces(paths, tokens, cut, options["piece_bytes"]):
                splits.feed(split, units, size, documents)
                phase.update(sum(splits.sizes.values()) / 1e6, f"{splits.records():,} records")
            splits.end()
            counts = splits.close(tokens)  # waits for the pool's last ids
    finally:
        if isinstance(tokenize, subword.Encoder):
            tokenize.close()
    info["source_sha256"] = scanned.sha256
    info.update(counts)
    return info


def _no_record(split: str, count: int, unit: str) -> str:
    return (
        f"the {split} split has {count} {unit}s, no record of 2 tokens or more: give more text or change "
        "--eval_fraction"
    )


def _windows(tokens: int, context: int) -> int:
    """Records of a split of `tokens` ids cut in windows (documents "none"): starts 0, context, ... < tokens - 1."""
    return -(-(tokens - 1) // context) if tokens >= 2 else 0


def _byte_ids(units: bytes) -> np.ndarray:
    return np.frombuffer(units, np.uint8)


def _char_ids(chars: list[str]):
    table = np.full(ord(chars[-1]) + 1, -1, np.int32)
    table[[ord(c) for c in chars]] = np.arange(len(chars), dtype=np.int32)
    return lambda units: table[np.frombuffer(units.encode("utf-32-le"), np.uint32)]


class _Splits:
    """The two splits' windows and shards, fed the pieces in order (train's, then eval's)."""

    def __init__(self, building, context, expected, train_shards, tokenize):
        counts = {"train": train_shards, "eval": 1}
        self.shards = {n: Shards(os.path.join(building, n), expected[n], counts[n]) for n in SPLITS}
        self.windows = {name: Windows(context, self.shards[name].write) for name in SPLITS}
        self.sizes = dict.fromkeys(SPLITS, 0)  # UTF-8 bytes
        self.units = dict.fromkeys(SPLITS, 0)  # characters or bytes: the tokens of char and byte tokens
        self.tokenize, self.current, self.paragraphs = tokenize, None, None

    def records(self) -> int:
        """Records cut so far, both splits."""
        return sum(windows.records for windows in self.windows.values())

    def feed(self, split: str, units, size: int, documents: str) -> None:
        if split != self.current:
            self.end()
            self.current, self.paragraphs = split, text_stream.Paragraphs(documents, isinstance(units, bytes))
        self.sizes[split] += size
        self.units[split] += len(units)
        self._deliver(self.paragraphs.feed(units))

    def end(self) -> None:
        """Ends the current split (its last document)."""
        if self.paragraphs is not None:
            self._deliver(self.paragraphs.end())
            self.paragraphs = None

    def _deliver(self, fragments: list) -> None:
        tag = (self.current, [ends for _, ends in fragments])
        if isinstance(self.tokenize, subword.Encoder):
            self._take(self.tokenize.submit([text for text, _ in fragments], tag))
        else:
            self._take([(tag, [self.tokenize(text) for text, _ in fragments])])

    def _take(self, done: list) -> None:
        for (split, ends), ids in done:
            for piece_ids, piece_ends in zip(ids, ends, strict=True):
                self.windows[split].add(piece_ids)
                if piece_ends:
                    self.windows[split].end_document()

    def close(self, tokens: str) -> dict:
        """The counts for vocab.json, once every record is written.

        Raises:
            DataError: When a split has no record (fewer than 2 tokens in any document).
        """
        if isinstance(self.tokenize, subword.Encoder):
            self._take(self.tokenize.drain())
        # char and byte tokens: the split's characters or bytes; subword: the ids encoded (no blank lines between
        # paragraphs: they are not encoded)
        counts = {n: self.windows[n].tokens if tokens == "subword" else self.units[n] for n in SPLITS}
        for name in SPLITS:
            if not self.windows[name].records:
                raise DataError(_no_record(name, counts[name], "subword token" if tokens == "subword" else tokens))
        written = {name: self.shards[name].close() for name in SPLITS}
        return {
            "train_tokens": counts["train"],
            "eval_tokens": counts["eval"],
            "bytes": self.sizes,
            "records": {name: count for name, (count, _) in written.items()},
            "shards": {name: shards for name, (_, shards) in written.items()},
        }
