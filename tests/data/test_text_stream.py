"""The streamed writer of data/text_write.py writes, for char and byte tokens, the very files (records, shards,
vocab.json) the in-memory writer wrote before it: their sha256 below was computed from that writer (main at
394379d) on the default corpus of Python 3.11.7."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
import tensorflow as tf

from data import text as text_data
from data import text_records, text_stream

CORPUS_SHA256 = "71f2ff5d99bdc1f9c48c5c2353ad138201c5ca1c377e0226857ef8fa89b8bcee"
# sha256 of "name sha256\n" over the sorted files of OUT, written with eval_fraction 0.1.
BEFORE = {
    ("char", "none", 64): "a08c1c6abe801a33e54136e3dc59dd617c302d4867c82c6e95f540777a7b9f2d",
    ("char", "none", 7): "e377248e887572585637e0b2549515fad7d674f9a227b07e81cb82175db4a57c",
    ("char", "paragraphs", 64): "229faa029fbe74138e59e1cca7be2f3900459b9a8d8d65eecc59af6919a5be32",
    ("char", "paragraphs", 7): "3c761b8ca94bbc9146fe73e7798624024fdbee35d23b5d73e9b8bf73498757b9",
    ("byte", "none", 64): "7afa30be41910a1040f2deb2bae866ee3b5ae7b005eb3c6184aac529de39d154",
    ("byte", "none", 7): "01e336ce3fb83d11f8690eabbccc48b67865c644a0dd5abb31bcc120a5e86780",
    ("byte", "paragraphs", 64): "12556829f78fdae8ff597b9788a725d5efab7049250e21cdd4908930a4c9a762",
    ("byte", "paragraphs", 7): "e2be067d088f8b973b7d63325b53d089c48d65631bc9ab73f38bef1f4981b1ea",
}


def _digest(directory) -> str:
    files = sorted(os.listdir(directory))
    lines = [f"{name} {hashlib.sha256((directory / name).read_bytes()).hexdigest()}\n" for name in files]
    return hashlib.sha256("".join(lines).encode()).hexdigest()


@pytest.mark.parametrize("piece_bytes", [pytest.param(text_stream.PIECE_BYTES, marks=pytest.mark.quick), 97])
@pytest.mark.parametrize("tokens, documents, context", sorted(BEFORE))
def test_streamed_records_are_those_written_before(tmp_path, monkeypatch, tokens, documents, context, piece_bytes):
    """Pieces of 97 bytes cut lines, blank lines and UTF-8 characters' neighbours across pieces."""
    text, sha256 = text_data.default_corpus()
    if sha256 != CORPUS_SHA256:
        pytest.skip(f"this Python's default corpus is another text ({sha256[:16]})")
    monkeypatch.setattr(text_stream, "PIECE_BYTES", piece_bytes)
    text_data.write_records(text, str(tmp_path / "out"), tokens, context, 0.1, documents)
    assert _digest(tmp_path / "out") == BEFORE[tokens, documents, context]
    assert sorted(os.listdir(tmp_path)) == ["out"]  # the building directory is gone


@pytest.mark.quick
@pytest.mark.parametrize("largest", [127, 255, 20_000, (1 << 21) - 1])
@pytest.mark.parametrize("length", [2, 65, 300])
def test_records_are_serialized_as_tf_train_example_would(largest, length):
    windows = np.random.default_rng(length).integers(0, largest + 1, size=(5, length))
    windows[0, 0] = largest
    expected = [
        tf.train.Example(
            features=tf.train.Features(feature={"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=row))})
        ).SerializeToString()
        for row in windows.tolist()
    ]
    assert text_records.serialize(windows) == expected


@pytest.mark.quick
def test_pieces_end_after_a_newline_or_between_characters(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"ab\ncd")
    (tmp_path / "b.txt").write_bytes(("é" * 10 + "\nxy").encode())
    pieces = list(text_stream.read_pieces([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], piece_bytes=8))
    assert b"".join(pieces) == "ab\ncdéééééééééé\nxy".encode()
    assert [p.decode() for p in pieces] == ["ab\n", "cdééé", "éééé", "ééé\n", "xy"]


@pytest.mark.quick
def test_a_blank_line_across_two_pieces_still_splits_paragraphs():
    paragraphs = text_stream.Paragraphs("paragraphs", is_bytes=False)
    fragments = paragraphs.feed("one\n") + paragraphs.feed(" \t\n") + paragraphs.feed("two\n\n") + paragraphs.end()
    documents, current = [], ""
    for text, ends in fragments:
        current += text
        if ends:
            documents, current = [*documents, current], ""
    assert [d for d in documents if d] == ["one", "two"] and current == ""
