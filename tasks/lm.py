"""`--task=lm`: next-token prediction over text records with a decoder-only Transformer.

Records hold one int64 list `tokens` of up to context + 1 ids (`python -m data.prepare text`, data/text.py);
the model sees tokens[:-1] and predicts tokens[1:]. The loss is per target token (padding weighs 0), so the
engine's division by the summed weights makes it the mean over the batch's real tokens. Metrics:
`bits_per_byte` (the loss in bits over the UTF-8 bytes the targets stand for: comparable between char, byte
and subword tokens; a subword token stands for its piece's bytes, data.subword.token_bytes) and `accuracy`
(next-token arg-max hits); eval adds `perplexity`.

Its arguments are its own (`tasks.lm_options`, declared without TensorFlow; flags `--lm_layers` ...):
`preset` ("none"; "gpt2-small" sets the four sizes), `layers` (4), `heads` (4), `width` (128), `context`
(64), `positions` ("learned"), `dropout` (0.0), read from `config.task.options`. The vocabulary is
vocab.json next to the first training file, or the default corpus's (data.text.ensure_default_lm_data,
`char` tokens) when no --train_data is given; subword records bring their SentencePiece model file, beside
vocab.json. Nothing random happens per example.
"""

from __future__ import annotations

import base64
import functools
import math
import os

import keras
import numpy as np
import tensorflow as tf

from data import list_files, text_vocab
from data import text as text_data
from data.schema import DataError, Feature
from models import vocab_shards
from models.transformer import transformer_lm
from tasks import lm_generate
from tasks.base import Task
from tasks.lm_options import OPTIONS

DEFAULT_TOKENS = "char"  # the default corpus's tokens (nanoGPT's shakespeare_char); own records say their own


class LanguageModel(Task):
    """A character-, byte- or subword-level language model; see the module docstring."""

    name = "lm"
    vocabulary_shards = True  # loss, metrics and serving on a split head's shards (models.vocab_shards)
    metric_names = ("bits_per_byte", "accuracy")
    eval_metric = "loss"
    model_facts = ("tokens", "vocab_size", "vocab", "subword_model_sha256")  # the vocabulary its weights are for

    def __init__(self, config):
        super().__init__(config)
        options = OPTIONS.values(config.task.option_dict)  # every argument, defaults filled in
        self.layers, self.heads, self.width = options["layers"], options["heads"], options["width"]
        self.context, self.positions, self.dropout = options["context"], options["positions"], options["dropout"]
        self.preset = options["preset"]
        if self.context < 1:
            raise DataError(f"task lm: context ({self.context}) must be >= 1")

    # --- records ---------------------------------------------------------------------------------------------

    def features(self) -> dict[str, Feature]:
        # Bounds: an id past the vocabulary fails the input pipeline naming its record (not the embedding).
        # Up to the records' own context + 1 (shorter than the model's: a warning at start), which the memory
        # checks then count at.
        written = [self.vocab["context"]] + [found[1].get("context") for found in self._eval_vocab]
        length = min(self.context, max(w for w in written if isinstance(w, int))) + 1
        return {text_data.TOKENS_KEY: Feature("int64", max_length=length, bounds=(0, self.vocab_size))}

    def preprocess(self, example, seed, training):
        del seed, training  # every record is used whole: nothing random
        return {text_data.TOKENS_KEY: tf.cast(example[text_data.TOKENS_KEY], tf.int32)}

    def default_data(self) -> tuple[str, str]:
        train_glob, eval_glob, _ = text_data.ensure_default_lm_data(self.context, DEFAULT_TOKENS)
        return train_glob, eval_glob

    @functools.cached_property
    def vocab(self) -> dict:
        """vocab.json of the training records (data.text.read_vocab), checked against the context and the eval
        records' (as `python -m trainer` checks them before TensorFlow, tasks.lm_options: for a library run)."""
        train_data = getattr(self.config.data, "train_data", None)
        if train_data:
            files = list_files(train_data, what="train_data")
            path = os.path.join(os.path.dirname(files[0]), text_data.VOCAB_FILE)
        else:
            path = text_data.ensure_default_lm_data(self.context, DEFAULT_TOKENS)[2]
        vocab = text_data.read_vocab(path)
        evaluation = self._eval_vocab[0] if self._eval_vocab else None
        problem = text_vocab.mismatch((path, vocab), evaluation)
        for found in [(path, vocab), *self._eval_vocab]:
            problem = problem or text_vocab.context_problem(found, self.context)
        if problem:
            raise DataError(f"task lm: {problem}")
        return vocab

    @functools.cached_property
    def _eval_vocab(self) -> list[tuple[str, dict]]:
        """[(path, contents)] of the vocab.json beside own eval records, or []."""
        data = self.config.data
        evaluation = getattr(data, "eval_data", None) if getattr(data, "train_data", None) else None
        found = text_vocab.vocab_beside(evaluation) if evaluation else None
        return [found] if found else []

    @property
    def vocab_size(self) -> int:
        tokens = self.vocab["tokens"]
        return len(self.vocab["chars"]) if tokens == "char" else 256 if tokens == "byte" else self.vocab["vocab_size"]

    # --- model and objective ---------------------------------------------------------------------------------

    def build_model(self) -> keras.Model:
        # Split over tensor-parallel shards by the engine, from the model's own plan (models.layout): its logits
        # may then be a tuple of vocabulary shards, which loss, metrics and serving take through `vocab_shards`.
        return transformer_lm(
            self.vocab_size, self.layers, self.heads, self.width, self.context, self.positions, self.dropout
        )

    def model_description(self, model: keras.Model) -> str:
        """`transformer gpt2-small (12 layers, ...)`: what the banner, metrics.json and HParams call the model."""
        del model
        preset = "" if self.preset == "none" else f" {self.preset}"
        sizes = f"{_count(self.layers, 'layer')}, {_count(self.heads, 'head')}, width {self.width}"
        return f"transformer{preset} ({sizes}, context {self.context}, {self.positions} positions)"

    def model_inputs(self, batch):
        tokens = batch[text_data.TOKENS_KEY]
        return tokens[:, :-1], batch[text_data.TOKENS_KEY + "_length"] - 1

    def loss(self, outputs, batch):
        targets, weights = _targets(batch)
        logits = tf.nest.map_structure(lambda x: tf.cast(x, tf.float32), outputs)
        return vocab_shards.cross_entropy(logits, targets), weights

    def metrics(self, outputs, batch):
        logits = tf.nest.map_structure(lambda x: tf.cast(x, tf.float32), outputs)
        losses, weights = self.loss(logits, batch)
        targets, _ = _targets(batch)
        target_bytes = tf.gather(tf.constant(self._bytes_per_token), targets) * weights
        hits = tf.cast(tf.equal(vocab_shards.argmax(logits), targets), tf.float32)
        return {
            "bits_per_byte": (tf.reduce_sum(losses * weights) / math.log(2.0), tf.reduce_sum(target_bytes)),
            "accuracy": (tf.reduce_sum(hits * weights), tf.reduce_sum(weights)),
        }

    def eval_metrics(self, totals):
        return {"perplexity": math.exp(min(totals["loss"], 700.0))}  # exp overflows a float past ~709

    @functools.cached_property
    def _bytes_per_token(self) -> np.ndarray:
        """UTF-8 bytes each token stands for (float32 [vocab]): 1 for byte tokens, each character's for char,
        each piece's for subword (a byte-fallback token 1). Kept as numpy, not a tensor: a tensor made while
        the engine traces a tf.function would belong to that graph, and the next trace could not use it."""
        if self.vocab["tokens"] == "byte":
            return np.ones([256], np.float32)
        if self.vocab["tokens"] == "subword":
            from data import subword

            return subword.token_bytes(self.vocab["model_proto"])
        return np.array([len(c.encode("utf-8")) for c in self.vocab["chars"]], np.float32)

    # --- serving ---------------------------------------------------------------------------------------------

    def serving(self, model):
        tokens = tf.TensorSpec([None, None], tf.int32, name="tokens")
        lengths = tf.TensorSpec([None], tf.int32, name="lengths")

        def all_logits(tokens):
            return {"logits": tf.cast(vocab_shards.whole(model(tokens, training=False), self.vocab_size), tf.float32)}

        def next_token(tokens, lengths):
            logits = tf.cast(vocab_shards.whole(model((tokens, lengths), training=False), self.vocab_size), tf.float32)
            return {"logits": tf.gather(logits, lengths - 1, batch_dims=1)}  # [B, vocab] at each last real token

        return {
            "serving_default": (all_logits, [tokens]),
            "next_token": (next_token, [tokens, lengths]),
            "generate": lm_generate.signature(model, self.describe()),  # text in, text out, with a cache
        }

    def describe(self) -> dict:
        """run.json's `task` entry (and the export's assets.extra/towerflow_serving.json); `python -m
        tasks.sample` reads tokens, vocab and context from it. Subword tokens add the SentencePiece model itself
        (`subword_model`, base64) and its sha256: the run directory holds what it takes to decode, as it holds a
        char vocabulary."""
        facts = {
            "source_sha256": self.vocab.get("source_sha256"),
            "tokens": self.vocab["tokens"],
            "vocab_size": self.vocab_size,
            "vocab": self.vocab.get("chars"),
            "context": self.context,
        }
        if self.vocab["tokens"] == "subword":
            facts["subword_model"] = base64.b64encode(self.vocab["model_proto"]).decode("ascii")
            facts["subword_model_sha256"] = self.vocab["model_sha256"]
        return facts


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _targets(batch) -> tuple[tf.Tensor, tf.Tensor]:
    """(tokens[:, 1:], float32 weights: 1 where the target is real, i.e. position < tokens_length - 1)."""
    targets = batch[text_data.TOKENS_KEY][:, 1:]
    lengths = batch[text_data.TOKENS_KEY + "_length"] - 1
    return targets, tf.sequence_mask(lengths, tf.shape(targets)[1], dtype=tf.float32)
