"""`python -m benchmarks.probes lm_vocab [--vocabs=256,2000,8000] [--windows=N] [--towers=N] [--batch=B]`: what the
vocabulary's size costs the default language model (4 layers, 4 heads, width 128, context 64), in parameters and
training tokens per second.

The default corpus is prepared once per vocabulary with `python -m data.prepare text` (256: `--tokens=byte`;
any other size: `--tokens=subword --vocab_size=N`), and each is trained by towerflow's own `build` (the README's
language-model run: adamw, learning rate 1e-3) in one process, in alternating timed windows (A, B, C, A, B, C,
...; median of each), so a change in the shared machine's load reaches every size alike. Every record is a full
window of context + 1 tokens, so tokens/s is examples/s x 64. Prints the load average at start and end, each
size's parameters (the embedding and the untied output projection are width x vocabulary each) and tokens/s,
and each size's rate over the first's. Results: benchmarks/results/lm-vocab.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.harness import paths, timing

CONTEXT = 64  # the task's default


def write_records(work: str, vocab: int) -> str:
    """The default corpus's records at `vocab` tokens (a subprocess: data.prepare's own checks); its train glob."""
    from data import text

    corpus = os.path.join(work, "pydoc-topics.txt")
    if not os.path.exists(corpus):
        with open(corpus, "w", encoding="utf-8") as f:
            f.write(text.default_corpus()[0])
    out = os.path.join(work, f"v{vocab}")
    tokens = ["--tokens=byte"] if vocab == 256 else ["--tokens=subword", f"--vocab_size={vocab}"]
    command = [sys.executable, "-m", "data.prepare", "text", corpus, out, *tokens]
    subprocess.run(command, cwd=paths.REPO_ROOT, check=True, capture_output=True)
    return os.path.join(out, "train-*.tfrecord")


class Size:
    """towerflow training the default model at one vocabulary; `window(steps)` returns (seconds, tokens)."""

    def __init__(self, work: str, vocab: int, towers: int, batch: int):
        from trainer.loop.build import build
        from trainer.settings import config as cfg

        train = write_records(work, vocab)
        config = cfg.RunConfig(
            data=cfg.DataConfig(train_data=train, eval_data=train.replace("train-*", "eval-*")),
            task=cfg.TaskConfig(name="lm", options={}),
            optimizer=cfg.OptimizerConfig(name="adamw", learning_rate=1e-3, schedule="constant"),
            towers=cfg.TowerConfig(num_towers=towers, device="cpu", parameter_device="cpu", global_batch_size=batch),
            loop=cfg.LoopConfig(model_dir=os.path.join(work, f"run{vocab}"), train_steps=10**9),
        )
        self.trainer = build(config)
        self.vocab = self.trainer.task.vocab_size
        self.parameters = sum(int(v.shape.num_elements()) for v in self.trainer.model.trainable_variables)
        self.batch = batch

    def window(self, steps: int) -> tuple[float, int]:
        start = time.perf_counter()
        float(self.trainer.updater.train_steps(steps).loss)  # waits for the last step
        return time.perf_counter() - start, steps * self.batch * CONTEXT


def measure(sizes: list[Size], windows: int, window_sec: float) -> list[list[float]]:
    """Tokens/s of each size's timed windows, after 3 warm-up steps each and a window that calibrates."""
    for s in sizes:
        s.window(3)
    per_step = max(s.window(4)[0] / 4 for s in sizes)
    steps = timing.calibrate(per_step, window_sec, min_steps=2)
    rates = [[] for _ in sizes]
    for _ in range(windows):
        for s, r in zip(sizes, rates, strict=True):
            r.append(timing.rate(s.window, steps))
    return rates


def report(sizes: list[Size], rates: list[list[float]]) -> list[str]:
    """One line per size: vocabulary, parameters, the output projection's share, tokens/s, examples/s, ratio."""
    heads = ("vocab", "parameters", "W x vocab", "tokens/s", "examples/s", "vs first", "pairs 25-75%")
    lines = [" ".join(f"{h:>11s}" for h in heads)]
    first = statistics.median(rates[0])
    for s, r in zip(sizes, rates, strict=True):
        median = statistics.median(r)
        share = s.trainer.task.width * s.vocab / s.parameters
        cells = (f"{s.vocab:,d}", f"{s.parameters:,d}", f"{share:.1%}", f"{median:,.0f}", f"{median / CONTEXT:.1f}")
        pairs = statistics.quantiles([a / b for a, b in zip(r, rates[0], strict=True)], n=4, method="inclusive")
        spread = f"{pairs[0]:.3f}-{pairs[2]:.3f}"
        lines.append(" ".join(f"{c:>11s}" for c in (*cells, f"{median / first:.3f}", spread)))
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes lm_vocab", description=__doc__.split("\n")[0])
    parser.add_argument("--vocabs", default="256,2000,8000", help="vocabulary sizes; 256 is byte tokens")
    parser.add_argument("--windows", type=int, default=7, help="timed windows per size")
    parser.add_argument("--window_sec", type=float, default=2.0, help="seconds a window aims at")
    parser.add_argument("--towers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32, help="global batch (sequences)")
    args = parser.parse_args(argv)
    print(f"load average at start {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="towerflow-lm-vocab-") as work:
        sizes = [Size(work, int(v), args.towers, args.batch) for v in args.vocabs.split(",")]
        rates = measure(sizes, args.windows, args.window_sec)
        for s in sizes:
            s.trainer.updater.close()
    print("\n".join(report(sizes, rates)))
    print(f"load average at end {os.getloadavg()}")
