"""Subword tokens: a SentencePiece model (BPE or unigram) trained on the train split's text, and the pool of
processes that encodes the text with it.

The model is trained offline, deterministically (the same text and settings give the same model bytes): a
fixed seed, one training thread, and a sample chosen without randomness: every k-th 1 MB piece of the train
text, k such that the sample holds about SAMPLE_BYTES, spread over the whole split (all of a smaller one).
It is trained in a process of its own, without TensorFlow: the trainer takes ~25 times the sample's bytes.
Lines are cut into sentences of at most SENTENCE_CHARS characters (SentencePiece skips longer ones).
The eval text is never read for training.

Settings that make decode(encode(text)) == text: no normalization ("identity"), whitespace kept as it is,
no dummy prefix, and byte fallback: a character outside the vocabulary becomes its UTF-8 bytes (ids 1..256);
id 0 is <unk> (never produced with byte fallback); no <s>, </s> or padding ids.
"""

from __future__ import annotations

import collections
import hashlib
import io
import itertools
import multiprocessing
import os
import re

import numpy as np

from data.schema import DataError

MODEL_FILE = "subword.model"
MODEL_TYPES = ("bpe", "unigram")
MIN_VOCAB = 260  # <unk>, 256 byte tokens and at least a few characters
MAX_VOCAB = 1 << 20
SAMPLE_BYTES = 16 << 20
SAMPLE_PIECE_BYTES = 1 << 20
SENTENCE_CHARS = 1000
SEED = 1
_TOO_SMALL = re.compile(r"smaller than required_chars\. (\d+) vs (\d+)")
_TOO_LARGE = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")


def sample_every(train_bytes: int) -> int:
    """k: train on every k-th SAMPLE_PIECE_BYTES piece of a train text of `train_bytes`, ~SAMPLE_BYTES in all."""
    return max(1, -(-train_bytes // SAMPLE_BYTES))


def sentences(pieces):
    """Lines of the pieces (str), long ones cut into SENTENCE_CHARS characters, empty ones left out."""
    for piece in pieces:
        for line in piece.split("\n"):
            for start in range(0, len(line), SENTENCE_CHARS):
                yield line[start : start + SENTENCE_CHARS]


def train(lines, vocab_size: int, model_type: str) -> bytes:
    """A SentencePiece model (serialized) trained on `lines` (an iterator of str).

    Raises:
        DataError: One line, when vocab_size is too small or too large for the text, or there is no text.
    """
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.set_random_generator_seed(SEED)
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=lines,
            model_writer=model,
            model_type=model_type,
            vocab_size=vocab_size,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            byte_fallback=True,
            character_coverage=0.9995,
            unk_id=0,
            bos_id=-1,
            eos_id=-1,
            pad_id=-1,
            num_threads=1,
            input_sentence_size=0,
            max_sentence_length=4 * SENTENCE_CHARS,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise DataError(_training_error(str(e), vocab_size)) from None
    return model.getvalue()


def _training_error(message: str, vocab_size: int) -> str:
    if small := _TOO_SMALL.search(message):
        return (
            f"--vocab_size ({vocab_size}) is too small for this text: its characters, the 256 byte tokens and "
            f"<unk> need at least {small.group(2)}"
        )
    if large := _TOO_LARGE.search(message):
        return f"--vocab_size ({vocab_size}) is too large for this text: SentencePiece finds at most {large.group(2)}"
    if "!sentences_.empty()" in message:  # only blank lines: nothing to learn pieces from
        return "the train split has no line of text, nothing to learn subword tokens from: give more text"
    return "SentencePiece could not train on this text: " + " ".join(message.split())[:300]


def train_apart(paths: list[str], cut: int, vocab_size: int, model_type: str) -> bytes:
    """`train` on the sample of the train split (the files' first `cut` bytes), in a process of its own: the
    trainer's memory (~25 times the sample's bytes) is returned when it ends, before records are written."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_train_sample, (paths, cut, vocab_size, model_type))


def _train_sample(paths: list[str], cut: int, vocab_size: int, model_type: str) -> bytes:
    from data import text_stream

    every = sample_every(cut)
    pieces = text_stream.split_pieces(paths, "subword", cut, SAMPLE_PIECE_BYTES)
    sample = (units for i, (split, units, _) in enumerate(pieces) if split == "train" and i % every == 0)
    return train(sentences(sample), vocab_size, model_type)


def processor(model: bytes):
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_proto=model)


def read_model(path: str, sha256: str | None = None) -> bytes:
    """The model file's bytes, checked: it loads, and has the sha256 vocab.json recorded.

    Raises:
        DataError: Naming the file, when it is missing, changed or not a SentencePiece model.
    """
    rewrite = "write the records again with `python -m data.prepare text ... --tokens=subword`"
    try:
        with open(path, "rb") as f:
            model = f.read()
    except OSError as e:
        raise DataError(f"subword model {path}: {e.strerror}; {rewrite}") from None
    actual = hashlib.sha256(model).hexdigest()
    if sha256 is not None and actual != sha256:
        raise DataError(
            f"subword model {path} has sha256 {actual[:16]}..., not {sha256[:16]}... as vocab.json says; {rewrite}"
        )
    try:
        processor(model)
    except (RuntimeError, OSError) as e:
        raise DataError(
            f"subword model {path} is not a SentencePiece model ({' '.join(str(e).split())[:200]}); {rewrite}"
        ) from None
    return model


def token_bytes(model: bytes) -> np.ndarray:
    """UTF-8 bytes each id stands for (float32 [vocab]): a byte token 1, <unk> 0, a piece its text's."""
    sp = processor(model)
    sizes = np.zeros([sp.get_piece_size()], np.float32)
    for i in range(len(sizes)):
        if sp.is_byte(i):
            sizes[i] = 1
        elif not (sp.is_unknown(i) or sp.is_control(i)):
            sizes[i] = len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
    return sizes


_worker = None


def _start_worker(model: bytes) -> None:
    global _worker
    _worker = processor(model)


def _encode(fragments: list[str]) -> list[np.ndarray]:
    return [encode_lines(_worker, text) for text in fragments]


def encode_lines(sp, text: str) -> np.ndarray:
    """`sp.encode(text)`, line by line: the same ids (no piece holds a newline: the trainer saw lines), at ~2.5 MB
    a second, where one encode of a 4 MB string takes ~100 bytes of memory a character and longer."""
    lines = text.split("\n")
    lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    return np.fromiter(itertools.chain.from_iterable(sp.encode(lines, num_threads=1)), np.int32)


class Encoder:
    """Encodes lists of fragments in a pool of processes (one per core), results in the order given.

    `submit(fragments, tag)` returns the (tag, ids list) pairs that are done, oldest first, keeping at most
    2 * processes lists in flight (memory stays bounded); `drain()` returns the rest.
    """

    def __init__(self, model: bytes, processes: int | None = None):
        self.processes = processes or len(os.sched_getaffinity(0))
        context = multiprocessing.get_context("spawn")  # no fork of a process with TensorFlow's threads
        self.pool = context.Pool(self.processes, initializer=_start_worker, initargs=(model,))
        self.pending = collections.deque()

    def submit(self, fragments: list[str], tag) -> list:
        self.pending.append((tag, self.pool.apply_async(_encode, (fragments,))))
        done = []
        while len(self.pending) > 2 * self.processes or (self.pending and self.pending[0][1].ready()):
            tag, result = self.pending.popleft()
            done.append((tag, result.get()))
        return done

    def drain(self) -> list:
        done = [(tag, result.get()) for tag, result in self.pending]
        self.pending.clear()
        return done

    def close(self) -> None:
        self.pool.terminate()
        self.pool.join()
