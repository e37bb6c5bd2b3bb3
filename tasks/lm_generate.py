"""The `generate` signature of the language model's export: prompt text in, text out, with a key/value cache.

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (subword runs only: registers the SentencePiece ops)

    generate = tf.saved_model.load("RUN_DIR/export/STEP").signatures["generate"]
    out = generate(prompt=tf.constant("The "), max_new_tokens=tf.constant(50), seed=tf.constant(1, tf.int64),
                   temperature=tf.constant(0.8), top_k=tf.constant(20))
    out["text"].numpy().decode()  # the prompt and its continuation; out["tokens"]: their ids

Inputs (scalars): `prompt` string (one text, at least one character), `max_new_tokens` int32 (>= 0), `seed`
int64, `temperature` float32 (<= 0: greedy, the arg-max; top_k and seed are then unused), `top_k` int32 (>= 0;
0: all tokens). Outputs: `text` string, the prompt and what follows as `python -m tasks.sample` prints it
(bytes that are not whole UTF-8 characters become U+FFFD), and `tokens` int32 [prompt + max_new_tokens], the
prompt's ids then the new ones.

Tokens are made in the graph: char tokens through the run's characters (a prompt character outside them fails
with a message naming it), byte tokens as the prompt's UTF-8 bytes, subword tokens by
`tensorflow_text.SentencepieceTokenizer` over the SentencePiece model the run carries (the same C++ library
`python -m tasks.sample` calls through `sentencepiece`).

Draws are tasks.sample's: logits / temperature, the top_k filter, `tf.random.stateless_categorical` seeded by
(seed, index of the new token). The prompt's last `context` tokens are run once (`cached_call` from position 0:
the prefill), then each new token at position p < context costs one position (`cached_call` at p, its keys and
values kept for the next). Once the tokens pass `context`, tasks.sample feeds the last `context` of them, whose
positions have all moved: no cached key holds, so from there each step runs the whole window without cache,
exactly as `next_token` does. The cached path computes the full call's ops on the same keys; its logits equal
the full call's to float32 rounding (a LayerNorm or matmul over one row may round differently than over T).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from models import vocab_shards

SPECS = [
    tf.TensorSpec([], tf.string, name="prompt"),
    tf.TensorSpec([], tf.int32, name="max_new_tokens"),
    tf.TensorSpec([], tf.int64, name="seed"),
    tf.TensorSpec([], tf.float32, name="temperature"),
    tf.TensorSpec([], tf.int32, name="top_k"),
]


def signature(model, facts: dict):
    """The `generate` endpoint, (function, specs), of `model` with the vocabulary `facts` (the task's
    `describe()`: tokens, vocab, subword_model). The function is a method of a tf.Module, which the export
    tracks, so a subword model's tokenizer resource is saved with it."""
    return Generator(model, tokenizer(facts)).generate, SPECS


def tokenizer(facts: dict) -> tf.Module:
    """The run's tokens in the graph: `encode(text) -> int32 [n]` and `decode(ids) -> string`."""
    if facts["tokens"] == "byte":
        return ByteTokens()
    if facts["tokens"] == "subword":
        return SubwordTokens(facts["subword_model"])
    return CharTokens(facts["vocab"])


class CharTokens(tf.Module):
    """Char ids by the run's characters (single code points): a search in their sorted code points."""

    def __init__(self, chars: list[str]):
        super().__init__(name="char_tokens")
        codes = np.array([ord(c) for c in chars], np.int32)
        order = np.argsort(codes, kind="stable")
        # numpy, not tensors: a tensor made here would belong to whatever graph is current.
        self._chars, self._codes, self._ids = np.array(chars, object), codes[order], order.astype(np.int32)

    def encode(self, text):
        codes = tf.strings.unicode_decode(text, "UTF-8")
        where = tf.minimum(tf.searchsorted(self._codes, codes, out_type=tf.int32), len(self._codes) - 1)
        known = tf.equal(tf.gather(self._codes, where), codes)
        missing = tf.strings.unicode_encode(tf.boolean_mask(codes, tf.logical_not(known)), "UTF-8")
        check = tf.debugging.Assert(
            tf.reduce_all(known), ["generate: the prompt has characters the vocabulary lacks:", missing]
        )
        with tf.control_dependencies([check]):
            return tf.gather(self._ids, where)

    def decode(self, ids):
        return tf.strings.reduce_join(tf.gather(tf.constant(self._chars, tf.string), ids))


class ByteTokens(tf.Module):
    """UTF-8 bytes; decoding replaces bytes that are not whole characters with U+FFFD, as bytes.decode does."""

    def __init__(self):
        super().__init__(name="byte_tokens")

    def encode(self, text):
        return tf.cast(tf.io.decode_raw(text, tf.uint8), tf.int32)

    def decode(self, ids):
        raw = tf.strings.reduce_join(tf.gather(tf.constant([bytes([b]) for b in range(256)]), ids))
        return tf.strings.unicode_transcode(raw, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)


class SubwordTokens(tf.Module):
    """SentencePiece ids by tensorflow_text, over the model `describe()` carries (base64)."""

    def __init__(self, encoded_model: str):
        super().__init__(name="subword_tokens")
        import base64

        import tensorflow_text

        model = base64.b64decode(encoded_model)
        self.sentencepiece = tensorflow_text.SentencepieceTokenizer(model=model, out_type=tf.int32)

    def encode(self, text):
        return self.sentencepiece.tokenize(text)

    def decode(self, ids):
        return self.sentencepiece.detokenize(ids)


class Generator(tf.Module):
    """`generate`: prefill, then a tf.while_loop of draws over a key/value cache; see the module docstring."""

    def __init__(self, model, tokens: tf.Module):
        super().__init__(name="generator")
        self.model, self.tokens = model, tokens

    def generate(self, prompt, max_new_tokens, seed, temperature, top_k):
        """{"text": the prompt and its continuation, "tokens": their ids} (SPECS; the module docstring)."""
        checks = [
            tf.debugging.assert_non_negative(max_new_tokens, message="generate: max_new_tokens must be >= 0"),
            tf.debugging.assert_non_negative(top_k, message="generate: top_k must be >= 0 (0: all tokens)"),
        ]
        with tf.control_dependencies(checks):
            prompt_ids = self.tokens.encode(prompt)
        empty = tf.debugging.assert_positive(tf.size(prompt_ids), message="generate: the prompt is empty")
        with tf.control_dependencies([empty]):
            window = prompt_ids[-self.model.context :][None]
        logits, cache = self.model.cached_call(window, 0, self.model.empty_cache(1))
        draw = Draw(seed, temperature, top_k)
        ids = self._loop(prompt_ids, logits[:, -1], cache, max_new_tokens, draw)
        return {"text": self.tokens.decode(ids), "tokens": ids}

    def _loop(self, ids, logits, cache, count, draw):
        def body(index, ids, logits, cache):
            ids = tf.concat([ids, draw(logits, index)], 0)
            logits, cache = tf.cond(index + 1 < count, lambda: self._step(ids, cache), lambda: (logits, cache))
            return index + 1, ids, logits, cache

        loop_vars = (tf.constant(0), ids, logits, cache)
        invariants = tf.nest.map_structure(lambda t: t.shape, loop_vars)
        invariants = (invariants[0], tf.TensorShape([None]), *invariants[2:])
        return tf.while_loop(lambda index, *_: index < count, body, loop_vars, shape_invariants=invariants)[1]

    def _step(self, ids, cache):
        """The logits [1, vocab] after `ids`: one cached position while they fit the context, else the whole
        last-`context` window without cache (as `next_token`); the cache is then left as it was."""
        length, context = tf.size(ids), self.model.context

        def cached():
            logits, kept = self.model.cached_call(ids[-1:][None], length - 1, cache)
            return logits[:, -1], kept

        def window():
            logits = self.model((ids[-context:][None], tf.fill([1], context)), training=False)
            logits = vocab_shards.whole(logits, self.model.vocab_size)
            return tf.cast(logits, tf.float32)[:, -1], cache

        return tf.cond(length <= context, cached, window)


class Draw:
    """tasks.sample's draw of the token at `index` from logits [1, vocab], or the arg-max at temperature <= 0."""

    def __init__(self, seed, temperature, top_k):
        self.seed, self.temperature, self.top_k = seed, temperature, top_k

    def __call__(self, logits, index):
        def sampled():
            scaled = logits / self.temperature
            scaled = tf.cond(self.top_k > 0, lambda: self._top_k(scaled), lambda: scaled)
            seed = tf.stack([self.seed, tf.cast(index, tf.int64)])
            return tf.cast(tf.random.stateless_categorical(scaled, 1, seed=seed)[0], tf.int32)

        def greedy():
            return tf.argmax(logits, axis=-1, output_type=tf.int32)  # the lowest id on a tie

        return tf.cond(self.temperature > 0, sampled, greedy)

    def _top_k(self, logits):
        kth = tf.math.top_k(logits, k=tf.minimum(self.top_k, tf.shape(logits)[-1])).values[:, -1:]
        return tf.where(logits < kth, tf.constant(-np.inf, logits.dtype), logits)
