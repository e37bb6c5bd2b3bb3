"""`python -m benchmarks.probes lm_generate [--context=N] [--positions=learned|rotary] [--repeats=R]`: what the
key/value cache of the export's `generate` signature (tasks/lm_generate.py) saves, in CPU time per new token.

A model of the default sizes (4 layers, 4 heads, width 128, 103 tokens; untrained: the time does not depend on
the weights) continues an 8-token prompt to the context, three ways:

  cache      `generate` as exported: the prefill, then one cached position per token
  no_cache   the same tf.while_loop, each token running the model on all tokens so far (no cache)
  sample     `tasks.sample.sample`: a Python loop calling a `next_token` tf.function once per token

A way's time per token is (time of N tokens - time of 0 tokens) / N, process CPU seconds (all threads: the
machine is shared, so wall time says more about the neighbours), the least of `repeats` calls. Prints the three
and whether the three produce the same ids.
"""

from __future__ import annotations

import argparse
import time

PROMPT = "abcdefgh"


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes lm_generate", description=__doc__.split("\n")[0])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--positions", choices=("learned", "rotary"), default="learned")
    parser.add_argument("--repeats", type=int, default=5)
    return parser.parse_args(argv)


def _cpu_seconds(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def _generate_way(model, generator_class, count: int, repeats: int):
    """(CPU seconds per token, ids) of a Generator class's traced `generate`, greedy-free (temperature 1)."""
    import tensorflow as tf

    from tasks import lm_generate

    chars = [chr(32 + i) for i in range(model.vocab_size)]
    function = generator_class(model, lm_generate.CharTokens(chars)).generate
    generate = tf.function(function, input_signature=lm_generate.SPECS, autograph=False)

    def call(n):
        seed, temperature, top_k = tf.constant(1, tf.int64), tf.constant(1.0), tf.constant(0)
        return generate(tf.constant(PROMPT), tf.constant(n), seed, temperature, top_k)["tokens"].numpy().tolist()

    ids = call(count)
    per_token = (_cpu_seconds(lambda: call(count), repeats) - _cpu_seconds(lambda: call(0), repeats)) / count
    return per_token, ids


def _sample_way(model, count: int, repeats: int):
    import tensorflow as tf

    from tasks import sample

    specs = [tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32)]

    @tf.function(input_signature=specs)
    def next_token(tokens, lengths):
        return {"logits": tf.gather(model((tokens, lengths)), lengths - 1, batch_dims=1)}

    prompt = [ord(c) - 32 for c in PROMPT]
    ids = sample.sample(next_token, prompt, count, model.context, 1, 1.0, 0)
    per_token = _cpu_seconds(lambda: sample.sample(next_token, prompt, count, model.context, 1, 1.0, 0), repeats)
    return per_token / count, ids


def main(argv=None) -> int:
    args = _parse(argv)
    import keras
    import tensorflow as tf

    from models.transformer import transformer_lm
    from tasks import lm_generate

    class NoCache(lm_generate.Generator):
        def _step(self, ids, cache):
            window = ids[-self.model.context :][None]
            return tf.cast(self.model(window, training=False), tf.float32)[:, -1], cache

    keras.utils.set_random_seed(0)
    model = transformer_lm(103, layers=4, heads=4, width=128, context=args.context, positions=args.positions)
    count = args.context - len(PROMPT)
    ways = {
        "cache": _generate_way(model, lm_generate.Generator, count, args.repeats),
        "no_cache": _generate_way(model, NoCache, count, args.repeats),
        "sample": _sample_way(model, count, max(1, args.repeats // 2)),
    }
    figures = ", ".join(f"{name} {seconds * 1e3:.2f} ms" for name, (seconds, _) in ways.items())
    same = len({tuple(ids) for _, ids in ways.values()}) == 1
    print(f"context {args.context}, {args.positions}: {count} tokens after {len(PROMPT)}; CPU per token: {figures}")
    print(f"same ids: {same}")
    return 0 if same else 1
