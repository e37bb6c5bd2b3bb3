"""`python -m data.prepare text --tokens=subword`: a SentencePiece model trained on the train split of the
default corpus, deterministic, ids below --vocab_size that decode back to the text; bad inputs refused in one
line; vocab.json's model checked by read_vocab."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil

import pytest

from data import DataError, prepare, subword
from data import text as text_data
from tests.support.records import token_records

CORPUS_SHA256 = "71f2ff5d99bdc1f9c48c5c2353ad138201c5ca1c377e0226857ef8fa89b8bcee"  # Python 3.11.7's
MODEL_SHA256 = "5e3db8165959170964b8c70a0cb7febb63cf83dd1e45270e1bae7d27bdd3d010"  # bpe, 2000, sentencepiece 0.2.1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    text, sha256 = text_data.default_corpus()
    path = tmp_path_factory.mktemp("corpus") / "topics.txt"
    path.write_bytes(text.encode("utf-8"))
    return text, sha256, str(path)


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("subword") / "out"
    assert prepare.main(["text", corpus[2], str(out), "--tokens=subword", "--vocab_size=2000"]) == 0
    return out, json.loads((out / "vocab.json").read_text())


def test_a_model_trained_on_the_train_split_whose_ids_decode_back_to_the_text(corpus, prepared):
    text, sha256, _ = corpus
    out, info = prepared
    model = (out / subword.MODEL_FILE).read_bytes()
    assert (info["tokens"], info["vocab_size"], info["subword_model"]) == ("subword", 2000, "bpe")
    assert info["model_file"] == "subword.model" and info["model_sha256"] == hashlib.sha256(model).hexdigest()
    if sha256 == CORPUS_SHA256:
        assert info["model_sha256"] == MODEL_SHA256
    raw = text.encode("utf-8")
    cut = int(len(raw) * 0.9)
    assert info["bytes"] == {"train": cut, "eval": len(raw) - cut}  # an ASCII byte there: no character moved
    sp = subword.processor(model)
    for split, part in (("train", raw[:cut].decode()), ("eval", raw[cut:].decode())):
        records = token_records(str(out / info["files"][split]))
        ids = records[0] + [t for r in records[1:] for t in r[1:]]  # windows overlap by one token
        assert max(ids) < 2000 and min(ids) >= 1  # 0 is <unk>: byte fallback never needs it
        assert ids == sp.encode(part) and sp.decode(ids) == part
        assert len(ids) == info[f"{split}_tokens"] and len(records) == info["records"][split]
        # Bits per byte: the bytes the tokens stand for add up to the split's
        assert subword.token_bytes(model)[ids].sum() == len(part.encode("utf-8"))
    assert sp.decode(sp.encode(text)) == text
    assert len(glob.glob(str(out / "train-*-of-00004.tfrecord"))) == 4


def test_the_same_text_gives_the_same_model_and_records(corpus, prepared, tmp_path):
    out, info = prepared
    assert prepare.main(["text", corpus[2], str(tmp_path / "again"), "--tokens=subword", "--vocab_size=2000"]) == 0
    for name in sorted(os.listdir(out)):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name


def test_unigram_and_paragraphs(corpus, tmp_path):
    args = ["--tokens=subword", "--vocab_size=1000", "--subword_model=unigram", "--documents=paragraphs"]
    assert prepare.main(["text", corpus[2], str(tmp_path / "out"), *args]) == 0
    info = json.loads((tmp_path / "out" / "vocab.json").read_text())
    assert (info["subword_model"], info["documents"], info["vocab_size"]) == ("unigram", "paragraphs", 1000)
    records = token_records(str(tmp_path / "out" / info["files"]["eval"]))
    assert max(max(r) for r in records) < 1000 and min(len(r) for r in records) >= 2


@pytest.mark.quick
@pytest.mark.parametrize(
    "args, message",
    [
        (["--tokens=char", "--vocab_size=500"], "--vocab_size is for --tokens=subword, not --tokens=char"),
        (["--subword_model=bpe"], "--subword_model is for --tokens=subword, not --tokens=byte"),
        (["--tokens=subword"], "--tokens=subword needs --vocab_size (e.g. 8000)"),
        (["--tokens=subword", "--vocab_size=100"], "--vocab_size (100) must be in [260, 1048576]"),
        (["--tokens=subword", "--vocab_size=300"], "--vocab_size (300) is too small for this text: "),
        (["--tokens=subword", "--vocab_size=5000"], "--vocab_size (5000) is too large for this text: "),
    ],
)
def test_bad_subword_arguments_exit_2_with_one_line(tmp_path, capsys, args, message):
    # 200 distinct characters, more than 300 - 257 need a token each; too little text for 5000 tokens.
    text = "".join(chr(0x400 + i) * (i % 7 + 2) + " " for i in range(200)) + "\n"
    (tmp_path / "text.txt").write_text(text * 30, encoding="utf-8")
    assert prepare.main(["text", str(tmp_path / "text.txt"), str(tmp_path / "OUT"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert sorted(os.listdir(tmp_path)) == ["text.txt"]  # no OUT, no building directory left


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: os.remove(d / "subword.model"), "subword.model: No such file"),
        (lambda d: (d / "subword.model").write_bytes(b"not a model"), "as vocab.json says"),
    ],
)
def test_read_vocab_names_a_missing_or_changed_model(prepared, tmp_path, damage, message):
    shutil.copytree(prepared[0], tmp_path / "out")
    assert text_data.read_vocab(str(tmp_path / "out" / "vocab.json"))["model_proto"][:2]
    damage(tmp_path / "out")
    with pytest.raises(DataError, match=message) as info:
        text_data.read_vocab(str(tmp_path / "out" / "vocab.json"))
    assert str(tmp_path / "out" / "subword.model") in str(info.value) and "\n" not in str(info.value)


@pytest.mark.quick
def test_a_file_that_is_not_a_model_is_named(tmp_path):
    (tmp_path / "subword.model").write_bytes(b"not a model")
    with pytest.raises(DataError, match="is not a SentencePiece model") as info:
        subword.read_model(str(tmp_path / "subword.model"))
    assert "\n" not in str(info.value)


@pytest.mark.quick
def test_sentences_are_lines_cut_to_a_bounded_length():
    pieces = ["a\n\n" + "b" * 2500 + "\nc"]
    assert [len(s) for s in subword.sentences(pieces)] == [1, 1000, 1000, 500, 1]
    assert subword.sample_every(10) == 1 and subword.sample_every(subword.SAMPLE_BYTES * 3 + 1) == 4
