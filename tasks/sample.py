"""Samples text from a trained language model: `python -m tasks.sample RUN_DIR [options]`.

    python -m tasks.sample /tmp/run --prompt "The " --tokens 200 --seed 1 --temperature 0.8 --top_k 20

Loads the newest SavedModel under RUN_DIR/export/<step>/ (the largest all-digit directory: the engine's
layout, trainer/outputs/export.py) with `tf.saved_model.load`, and calls its `next_token` signature
(tokens int32 [1, T], lengths int32 [1] -> logits [1, vocab]) on the last `context` tokens, once per new
token. The vocabulary is in RUN_DIR/run.json, where the engine records the task's `describe()`
(`tasks.lm.LanguageModel.describe()`) as `task.<key>`: `task.tokens` ("char", "byte" or "subword"),
`task.vocab` (the characters, for char tokens), `task.subword_model` (the SentencePiece model, base64, for
subword tokens) and `task.context`. Draws are stateless,
seeded by (--seed, token index): the same seed prints the same text. Prints the prompt and what follows as it
is drawn, a whole character at a time; at most MAX_TOKENS (100,000) new tokens. TensorFlow's and SentencePiece's
own lines are kept off the console as `python -m trainer` keeps them.
Without a cache: each token runs the whole window. The export's `generate` signature (tasks/lm_generate.py)
does the same in one call, with a key/value cache, and prints the same text; loading a subword run's export
imports tensorflow_text, whose SentencePiece ops `generate` holds.
A bad RUN_DIR, a missing export or run.json, a prompt outside the vocabulary or --tokens out of bounds: one
line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

RUN_FILE = "run.json"
SIGNATURE = "next_token"
# --tokens' bound. Not the model's: the window slides, so any count runs. Each token runs the model over its
# whole window without a cache: the default model (tasks.lm) samples ~50 tokens/s on 2 CPU cores (20.8 ms a
# token, measured over 2,000), so 100,000 tokens is about half an hour, and --tokens=1000000 would be six hours
# of a command that keeps nothing if stopped: more likely a slip of zeros than a wish.
MAX_TOKENS = 100_000


class SampleError(ValueError):
    """A run directory or prompt the sampler cannot use; the message says what to change."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tasks.sample", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    parser.add_argument("--tokens", type=int, default=200, help=f"tokens to generate (0 to {MAX_TOKENS})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0, help="> 0; lower is more conservative")
    parser.add_argument("--top_k", type=int, default=0, help="sample among the k likeliest tokens; 0: all")
    return parser


def newest_export(run_dir: str) -> str:
    """RUN_DIR/export/<largest step>/.

    Raises:
        SampleError: When RUN_DIR or its export/<step>/ directories are missing.
    """
    if not os.path.isdir(run_dir):
        raise SampleError(f"run directory {run_dir} does not exist")
    base = os.path.join(run_dir, "export")
    steps = sorted(int(name) for name in os.listdir(base) if name.isdigit()) if os.path.isdir(base) else []
    if not steps:
        raise SampleError(f"{run_dir} has no export/<step>/ SavedModel; train the run with its export on")
    return os.path.join(base, str(steps[-1]))


def read_vocabulary(run_dir: str) -> dict:
    """run.json's `task.*` entries: {"tokens": "char"|"byte"|"subword", "vocab": [chars] (char),
    "subword_model": base64 (subword), "context": int}; for subword tokens "processor" is added, the loaded
    SentencePiece model.

    Raises:
        SampleError: When run.json is missing, unreadable or lacks those keys.
    """
    path = os.path.join(run_dir, RUN_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            task = {k[len("task.") :]: v for k, v in json.load(f).items() if k.startswith("task.")}
    except (OSError, ValueError, AttributeError) as e:
        raise SampleError(f"cannot read {path}: {e}") from None
    tokens = ("char", "byte", "subword")
    ok = isinstance(task, dict) and task.get("tokens") in tokens and isinstance(task.get("context"), int)
    if ok and task["tokens"] == "char":
        ok = isinstance(task.get("vocab"), list) and len(task["vocab"]) > 0
    if ok and task["tokens"] == "subword":
        ok = isinstance(task.get("subword_model"), str)
    if not ok:
        raise SampleError(
            f"{path} has no task.tokens, task.vocab and task.context (task.subword_model for subword tokens): "
            "not a --task=lm run"
        )
    if task["tokens"] == "subword":
        task["processor"] = _subword_processor(task["subword_model"], path)
    return task


def _subword_processor(encoded: str, path: str):
    """The SentencePiece model run.json holds (base64), loaded as `python -m data.prepare` loads it.

    Raises:
        SampleError: When it is not base64 of a SentencePiece model.
    """
    import base64
    import binascii

    from data import subword

    try:
        return subword.processor(base64.b64decode(encoded, validate=True))
    except (binascii.Error, RuntimeError, ValueError) as e:
        raise SampleError(f"{path}: task.subword_model is not a SentencePiece model ({e})") from None


def encode(text: str, task: dict) -> list[int]:
    """Token ids of `text` in the run's vocabulary.

    Raises:
        SampleError: For an empty text or a character the vocabulary lacks.
    """
    if task["tokens"] == "byte":
        ids = list(text.encode("utf-8"))
    elif task["tokens"] == "subword":
        ids = task["processor"].encode(text)  # byte fallback: any character has ids
    else:
        index = {c: i for i, c in enumerate(task["vocab"])}
        missing = sorted({c for c in text if c not in index})
        if missing:
            raise SampleError(f"--prompt has characters the vocabulary lacks: {''.join(missing)!r}")
        ids = [index[c] for c in text]
    if not ids:
        raise SampleError("--prompt is empty; give at least one character")
    return ids


def decode(ids: list[int], task: dict) -> str:
    """Text of token ids (bytes that are not whole UTF-8 characters become U+FFFD)."""
    if task["tokens"] == "byte":
        return bytes(ids).decode("utf-8", errors="replace")
    if task["tokens"] == "subword":
        return task["processor"].decode(ids)
    return "".join(task["vocab"][i] for i in ids)


class Decoder:
    """`decode` a token at a time: `add(id)` returns the text that became whole characters, `end()` the rest;
    what they return, joined, is `decode(every id, task)`, character for character. A byte token or a subword
    byte piece may be part of a character: such tokens are held until the next token that ends one (a byte
    token through Python's incremental UTF-8 decoder, subword pieces up to the next piece that is not a byte)."""

    def __init__(self, task: dict):
        import codecs

        self.task = task
        self.held: list[int] = []
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token: int) -> str:
        if self.task["tokens"] == "byte":
            return self.utf8.decode(bytes([token]))
        if self.task["tokens"] == "char":
            return self.task["vocab"][token]
        self.held.append(token)
        if self.task["processor"].is_byte(token):
            return ""
        text, self.held = decode(self.held, self.task), []
        return text

    def end(self) -> str:
        if self.task["tokens"] == "byte":
            return self.utf8.decode(b"", final=True)
        text, self.held = decode(self.held, self.task) if self.held else "", []
        return text


def sample(next_token, prompt, count: int, context: int, seed: int, temperature: float, top_k: int, on_token=None):
    """`prompt` followed by `count` sampled token ids; `on_token(id)` is called with each new one as it is drawn.

    Args:
        next_token: The SavedModel's `next_token` signature.
        prompt: Token ids to start from (at least one).
        count: Tokens to add.
        context: The model's longest input: only the last `context` tokens are fed.
        seed: The stateless seed's first half; the second is the token's index.
        temperature: Logits are divided by it (> 0).
        top_k: Keep only the k largest logits (0: all).
    """
    import tensorflow as tf

    ids = list(prompt)
    for index in range(count):
        window = ids[-context:]
        outputs = next_token(tokens=tf.constant([window], tf.int32), lengths=tf.constant([len(window)], tf.int32))
        logits = outputs["logits"] / temperature
        if top_k:
            kth = tf.math.top_k(logits, k=min(top_k, logits.shape[-1])).values[:, -1:]
            logits = tf.where(logits < kth, tf.constant(-float("inf"), logits.dtype), logits)
        draw = tf.random.stateless_categorical(logits, 1, seed=tf.constant([seed, index], tf.int64))
        ids.append(int(draw[0, 0]))
        if on_token is not None:
            on_token(ids[-1])
    return ids


def _check(args: argparse.Namespace) -> None:
    if not 0 <= args.tokens <= MAX_TOKENS:
        raise SampleError(
            f"--tokens ({args.tokens}) must be between 0 and {MAX_TOKENS} (each token runs the model over its "
            "whole window: about half an hour for the default model on 2 CPU cores); sample again with another "
            "--seed for more"
        )
    if not args.temperature > 0:
        raise SampleError(f"--temperature ({args.temperature}) must be > 0")
    if args.top_k < 0:
        raise SampleError(f"--top_k ({args.top_k}) must be >= 0")


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit code (0, or 2 with one line on stderr).

    The text goes to stdout as it is drawn, a whole character at a time (`Decoder`), flushed after every token:
    a long sample shows from its first token on, and what it prints is `decode` of every id, as before.
    """
    args = _parser().parse_args(argv)
    try:
        _check(args)
        export = newest_export(args.run_dir)
        task = read_vocabulary(args.run_dir)
        prompt = encode(args.prompt, task)
        next_token = _load(export, task)
    except SampleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    decoder = Decoder(task)
    _write("".join(decoder.add(token) for token in prompt))
    sample(
        next_token,
        prompt,
        args.tokens,
        task["context"],
        args.seed,
        args.temperature,
        args.top_k,
        on_token=lambda token: _write(decoder.add(token)),
    )
    _write(decoder.end() + "\n")
    return 0


def _write(text: str) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


def _load(export: str, task: dict):
    """The export's `next_token` signature. TensorFlow's start-up lines and those of loading (its SentencePiece's,
    for subword runs) are kept off stderr as `python -m trainer` keeps them (`data.native_log`).

    Raises:
        SampleError: When the export has no `next_token` signature.
    """
    from data import native_log

    with native_log.quiet_first_import(native_log.QUIET_LEVEL):  # only once the run directory is known to be good
        import tensorflow as tf

        if task["tokens"] == "subword":
            import tensorflow_text  # noqa: F401  (the export's `generate` holds SentencePiece ops: load needs them)
    with native_log.native_stderr_filtered(native_log.level_in_force()):
        loaded = tf.saved_model.load(export)
    if SIGNATURE not in loaded.signatures:
        raise SampleError(f"{export} has no '{SIGNATURE}' signature; was it a --task=lm run?")
    return loaded.signatures[SIGNATURE]


if __name__ == "__main__":
    sys.exit(main())
