"""Tests of data/text.py and `python -m data.prepare text`: splits, windows, paragraphs, vocab.json, the
default corpus."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import subprocess
import sys

import pytest

from data import prepare
from data import text as text_data
from tests.support.paths import ROOT
from tests.support.records import token_records


def _prepare(tmp_path, text: str, *args: str) -> tuple[dict, list[list[int]], list[list[int]]]:
    source = tmp_path / "input.txt"
    source.write_bytes(text.encode("utf-8"))
    out = tmp_path / "out"
    assert prepare.main(["text", str(source), str(out), *args]) == 0
    with open(out / "vocab.json", encoding="utf-8") as f:
        info = json.load(f)
    train = token_records(str(out / info["files"]["train"]))
    return info, train, token_records(str(out / info["files"]["eval"]))


@pytest.mark.quick
def test_char_split_windows_and_vocab(tmp_path):
    text = "".join(chr(ord("a") + i % 7) for i in range(103)) + "\n"  # 104 characters
    info, train, held_out = _prepare(tmp_path, text, "--tokens=char", "--context=8")
    chars = sorted(set(text))
    assert info["chars"] == chars == ["\n", "a", "b", "c", "d", "e", "f", "g"]
    assert (info["train_tokens"], info["eval_tokens"]) == (93, 11)  # int(104 * 0.9) = 93
    assert info["bytes"] == {"train": 93, "eval": 11}
    assert info["source_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert (info["context"], info["vocab_size"], info["tokens"]) == (8, 8, "char")
    ids = [chars.index(c) for c in text]
    # Stride 8, windows of 9: starts 0, 8, ..., 88 for 93 tokens; the last window holds 5.
    assert train == [ids[:93][s : s + 9] for s in range(0, 92, 8)]
    assert [len(r) for r in train] == [9] * 11 + [5]
    assert held_out == [ids[93:102], ids[101:104]]
    assert len(glob.glob(str(tmp_path / "out" / "train-*-of-00004.tfrecord"))) == 4
    assert os.path.isfile(tmp_path / "out" / "eval-00000-of-00001.tfrecord")


@pytest.mark.quick
def test_every_target_once_per_epoch(tmp_path):
    text = "the quick brown fox jumps over the lazy dog. " * 5
    info, train, _ = _prepare(tmp_path, text, "--tokens=char", "--context=3")
    targets = [token for record in train for token in record[1:]]
    ids = [info["chars"].index(c) for c in text[: info["train_tokens"]]]
    assert targets == ids[1:]  # each train token after the first is a target exactly once
    # 202 train tokens: 201 targets in 67 windows of 4; no window of 1 token (nothing to predict) after them.
    assert [len(r) for r in train] == [4] * 67


@pytest.mark.quick
def test_byte_tokens_split_by_bytes(tmp_path):
    text = "héllo wörld — ünïcode ✓ " * 4  # 96 characters, 128 UTF-8 bytes
    raw = text.encode("utf-8")
    info, train, held_out = _prepare(tmp_path, text, "--tokens=byte", "--context=16", "--eval_fraction=0.25")
    assert "chars" not in info and info["vocab_size"] == 256
    assert (info["train_tokens"], info["eval_tokens"]) == (96, 32)
    assert info["bytes"] == {"train": 96, "eval": 32}
    assert [t for r in train for t in r[1:]] == list(raw[1:96])
    assert held_out == [list(raw[96:113]), list(raw[112:128])]


@pytest.mark.quick
def test_paragraphs_one_record_each(tmp_path):
    text = "ab\n\ncd ef\n \n\nghijklmnop\nq\n\nz\n\n" + "rest of the text, held out\n"
    info, train, held_out = _prepare(
        tmp_path, text, "--tokens=char", "--context=4", "--documents=paragraphs", "--eval_fraction=0.47"
    )
    assert info["train_tokens"] == 30 and info["documents"] == "paragraphs"
    decode = lambda record: "".join(info["chars"][t] for t in record)
    # "z" has no target: dropped; "ghijklmnop\nq" (12 tokens) is cut into windows of 5, stride 4.
    assert [decode(r) for r in train] == ["ab", "cd ef", "ghijk", "klmno", "op\nq"]
    assert [decode(r) for r in held_out] == ["rest ", " of t", "the t", "text,", ", hel", "ld ou", "ut\n"]


@pytest.mark.quick
@pytest.mark.parametrize(
    "args, message",
    [
        (["MISSING", "OUT", "--tokens=char"], "missing.txt does not exist"),
        (["TEXT", "OUT", "--tokens=char", "--context=0"], "--context (0) must be >= 1"),
        (["TEXT", "OUT", "--tokens=byte", "--eval_fraction=1"], "--eval_fraction (1.0) must be in (0, 1)"),
        (["LATIN1", "OUT", "--tokens=char"], "is not UTF-8 (byte 3)"),
        (["SHORT", "OUT", "--tokens=char"], "the eval split has 1 chars"),
        (["DIR", "OUT"], "src is a directory: give its files, e.g. 'SRC/**/*.py' (in quotes: expanded here,"),
        (["NOGLOB", "OUT"], "no text files match 'SRC/**/*.md'; check the pattern"),
        (["EMPTY", "OUT"], "error: the train split has 0 bytes, no record of 2 tokens or more: give more text"),
        (  # as byte tokens say it, not SentencePiece's `Internal: src/trainer_interface.cc(433) [!sentences_.empty()]`
            ["EMPTY", "OUT", "--tokens=subword", "--vocab_size=500"],
            "error: the train split has 0 bytes, no record of 2 tokens or more: give more text",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, args, message):
    (tmp_path / "text.txt").write_text("some text to split\n" * 3)
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "short.txt").write_text("0123456789")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    for name in ("a.py", "pkg/b.py", "notes.txt"):
        (tmp_path / "src" / name).write_text("text\n")
    names = {"TEXT": "text.txt", "LATIN1": "latin1.txt", "SHORT": "short.txt", "MISSING": "missing.txt"}
    names.update(DIR="src", NOGLOB="src/**/*.md", EMPTY="empty.txt")
    message = message.replace("SRC", str(tmp_path / "src"))
    argv = ["text", *(str(tmp_path / names[a]) if a in names else str(tmp_path / a) for a in args[:2]), *args[2:]]
    assert prepare.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert not (tmp_path / "OUT").exists()


@pytest.mark.quick
def test_a_quoted_glob_is_its_files_at_any_depth_in_sorted_order(tmp_path):
    """'src/**/*.py' is the .py files of src and its folders, sorted by path: the records and vocab.json of the
    same files listed in that order."""
    for name, text in (("src/z.py", "zeta = 1\n" * 40), ("src/pkg/a.py", "alpha = 2\n" * 40), ("src/b.txt", "no\n")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert prepare.main(["text", str(tmp_path / "src" / "**" / "*.py"), str(tmp_path / "glob")]) == 0
    listed = [str(tmp_path / "src" / "pkg" / "a.py"), str(tmp_path / "src" / "z.py")]
    assert prepare.main(["text", *listed, str(tmp_path / "listed")]) == 0
    for name in ("vocab.json", "train-00000-of-00004.tfrecord", "eval-00000-of-00001.tfrecord"):
        assert (tmp_path / "glob" / name).read_bytes() == (tmp_path / "listed" / name).read_bytes(), name


@pytest.mark.quick
def test_default_corpus_is_pythons_topics():
    text, sha256 = text_data.default_corpus()
    assert text_data.default_corpus() == (text, sha256)
    assert sha256 == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert len(text) > 400_000


@pytest.mark.quick
def test_ensure_default_lm_data_builds_once(tmp_path, monkeypatch):
    train_glob, eval_glob, vocab_path = text_data.ensure_default_lm_data(32, "char", cache_dir=str(tmp_path))
    stamp = os.stat(vocab_path).st_mtime_ns
    monkeypatch.setattr(text_data, "write_records", None)  # a second build would fail calling it
    assert text_data.ensure_default_lm_data(32, "char", cache_dir=str(tmp_path)) == (train_glob, eval_glob, vocab_path)
    assert os.stat(vocab_path).st_mtime_ns == stamp
    monkeypatch.undo()
    other = text_data.ensure_default_lm_data(16, "byte", cache_dir=str(tmp_path))[2]
    assert os.path.dirname(other) != os.path.dirname(vocab_path) and text_data.read_vocab(other)["context"] == 16
    info = text_data.read_vocab(vocab_path)
    text, sha256 = text_data.default_corpus()
    assert info["source_sha256"] == sha256 and sha256[:16] in os.path.dirname(vocab_path)
    assert info["train_tokens"] == int(len(text) * 0.9) and info["train_tokens"] + info["eval_tokens"] == len(text)
    assert info["records"]["train"] == -(-(info["train_tokens"] - 1) // 32)
    assert len(glob.glob(train_glob)) == 4 and len(glob.glob(eval_glob)) == 1
    assert [name for name in os.listdir(tmp_path) if name.startswith(".")] == []  # no building dir left


@pytest.mark.quick
def test_bad_arguments_fail_before_tensorflow(tmp_path):
    argv = ["text", str(tmp_path / "missing.txt"), str(tmp_path / "out"), "--tokens=char"]
    code = (
        f"import sys; from data import prepare; code = prepare.main({argv!r}); "
        "assert 'tensorflow' not in sys.modules, 'imported'; sys.exit(code)"
    )
    root = ROOT
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=root),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "missing.txt does not exist" in result.stderr


NOISE = ("cudart_stub", "cpu_feature_guard", "oneDNN", "absl::InitializeLog")  # TensorFlow's start-up lines


def _quiet_run(args: list[str], cwd) -> subprocess.CompletedProcess:
    """`python ARGS` in a fresh process with this checkout first on the path and no TF_CPP_MIN_LOG_LEVEL set."""
    root = ROOT
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = root
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_prepare_text_without_tokens_writes_bytes_and_prints_no_tensorflow_lines(tmp_path):
    """--tokens defaults to byte; the command prints its two flags and none of TensorFlow's start-up lines."""
    (tmp_path / "input.txt").write_text("héllo, wörld: any UTF-8 text.\n\n" * 40, encoding="utf-8")
    result = _quiet_run(["-m", "data.prepare", "text", "input.txt", "out"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert [line.split("=")[0] for line in result.stdout.splitlines()] == ["--train_data", "--eval_data"]
    assert not [line for line in result.stderr.splitlines() if any(n in line for n in NOISE)], result.stderr
    info = json.loads((tmp_path / "out" / "vocab.json").read_text())
    # stderr: what was written, in one line; off a terminal, a pass of a few seconds adds no progress line
    records, tokens = info["records"], (info["train_tokens"], info["eval_tokens"])
    assert re.fullmatch(
        rf"wrote {records['train']} train records \(4 files\) and {records['eval']} eval records \(1 file\) of "
        rf"{tokens[0]:,} \+ {tokens[1]:,} byte tokens from 1 file \(0\.0 MB\) in 0:00:\d\d\n",
        result.stderr,
    ), result.stderr
    assert (info["tokens"], info["vocab_size"]) == ("byte", 256)
    assert len(glob.glob(str(tmp_path / "out" / "train-*"))) == 4 and glob.glob(str(tmp_path / "out" / "eval-*"))


def test_a_script_writing_records_through_data_prints_no_tensorflow_lines(tmp_path):
    """`import data` then `data.write_feature_records`: the lazy import of TensorFlow is quiet (INFO hidden)."""
    script = tmp_path / "mine.py"
    script.write_text(
        "import data\n"
        "schema = data.FeatureSchema.of({'x': data.Feature('int64', (4,))}, 'mine')\n"
        "print(data.write_feature_records('out/x.tfrecord', [{'x': [1, 2, 3, 4]}] * 5, schema))\n"
    )
    result = _quiet_run([str(script)], tmp_path)
    assert result.returncode == 0 and result.stdout == "5\n", result.stderr
    assert not [line for line in result.stderr.splitlines() if any(n in line for n in NOISE)], result.stderr
    assert (tmp_path / "out" / "x.tfrecord").stat().st_size > 0
