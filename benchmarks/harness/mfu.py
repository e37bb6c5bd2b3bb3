"""Model FLOPs utilisation (MFU) of the language model's sides: the model's training FLOPs per second against
the machine's own measured matmul peak.

FLOPs per token as nanoGPT's `estimate_mfu` and the PaLM paper count them: 6 * N + 12 * L * T * W, with N the
weights that multiply activations in a matmul: each block's 12 * W^2 (query, key, value and output
projections; the MLP's W x 4W and 4W x W) and the head's W * V, which every side runs whether its head is tied
to the embedding (Keras Hub, nanoGPT) or not (towerflow). Not in N: the embedding lookups, learned positions,
biases and LayerNorms, which are not matmuls. 12 * L * T * W is attention's two matmuls (scores and weighted
values) over the whole context, counted forward and backward as nanoGPT does (a causal mask halves the useful
part; no side skips the masked half here). The same formula for every side, so MFU ratios are tokens/s ratios.

The peak is a float32 [n, n] x [n, n] matmul timed in the side's own framework (TensorFlow or PyTorch), in the
same worker right after the side's timed windows, PEAK_REPEATS times; a run's MFU divides by the largest peak any
side measured. Every repeat is kept: their median and spread tell whether the two sides of a figure had the same
machine (benchmarks/harness/trust.py).
"""

from __future__ import annotations

import os
import time

PEAK_SIZE = 2048  # [2048, 2048] x [2048, 2048]: 17 GFLOP, ~0.2 s on 2 cores; large enough for the best kernel
PEAK_REPEATS = 10  # the best of them: the machine is shared, and a burst of other work only slows a repeat


def matmul_weights(vocab_size: int, layers: int, width: int) -> int:
    """N: the weights that multiply activations in a matmul (see the module docstring)."""
    return layers * 12 * width * width + width * vocab_size


def flops_per_token(vocab_size: int, layers: int, width: int, context: int) -> int:
    """Training FLOPs per token (forward and backward): 6 * N + 12 * layers * context * width."""
    return 6 * matmul_weights(vocab_size, layers, width) + 12 * layers * context * width


def _rates(product, size: int, repeats: int) -> list[float]:
    """FLOP/s of each of `repeats` calls of `product()` (a [size, size] x [size, size] matmul, waited for)."""
    product()  # the first call picks and loads the kernel
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        product()
        rates.append(2 * size**3 / (time.perf_counter() - start))
    return rates


def tensorflow_peak(size: int = PEAK_SIZE, repeats: int = PEAK_REPEATS) -> tuple[list[float], int]:
    """The FLOP/s of each of `repeats` float32 [size, size] matmuls in TensorFlow (eager, the default device),
    and the threads its intra-op pool has."""
    import tensorflow as tf

    a, b = tf.random.stateless_normal([size, size], [1, 2]), tf.random.stateless_normal([size, size], [3, 4])
    # float() waits for the product; the sum is 1/size of its cost
    rates = _rates(lambda: float(tf.reduce_sum(tf.matmul(a, b))), size, repeats)
    threads = tf.config.threading.get_intra_op_parallelism_threads() or len(os.sched_getaffinity(0))
    return rates, threads


def torch_peak(size: int = PEAK_SIZE, repeats: int = PEAK_REPEATS) -> tuple[list[float], int]:
    """The FLOP/s of each of `repeats` float32 [size, size] matmuls in PyTorch on the CPU (synchronous), and
    its threads."""
    import torch

    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator) for _ in range(2))
    return _rates(lambda: torch.mm(a, b), size, repeats), torch.get_num_threads()


def side_stats(vocab_size: int, layers: int, width: int, context: int, parameters: int, peak) -> dict:
    """What a language-model side reports for MFU (merged into its figure record by the runner): its sizes,
    its parameter count as its framework counts it, and `peak()` (one of the functions above) measured now:
    the best of its repeats (MFU's denominator), every repeat and the threads (what trust.py compares)."""
    rates, threads = peak()
    return {
        "tokens_per_example": context,
        "flops_per_token": flops_per_token(vocab_size, layers, width, context),
        "matmul_weights": matmul_weights(vocab_size, layers, width),
        "parameters": parameters,
        "matmul_peak_flops": max(rates),
        "matmul_rates": rates,
        "matmul_threads": threads,
        "peak_framework": peak.__name__.removesuffix("_peak"),
    }


def annotate(results: list[dict]) -> float | None:
    """Adds tokens_per_sec and mfu to each side of each figure record that reports `flops_per_token`, against
    the largest `matmul_peak_flops` of the run; returns that peak (None when no side measured one)."""
    measured = [record for record in results if record["status"] in ("ok", "refused")]
    sides = [record[label] for record in measured for label in ("a", "b")]
    sides = [side for side in sides if "flops_per_token" in side]
    if not sides:
        return None
    peak = max(side["matmul_peak_flops"] for side in sides)
    for side in sides:
        side["tokens_per_sec"] = side["median_examples_per_sec"] * side["tokens_per_example"]
        side["mfu"] = side["tokens_per_sec"] * side["flops_per_token"] / peak
    return peak
