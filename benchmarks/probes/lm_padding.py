"""`python -m benchmarks.probes lm_padding [--windows=N] [--towers=N] [--batch=B] [--pool=P]`: what padding costs
the language model, in real (non-pad) target tokens per second of towerflow training.

Records of mixed lengths: one per paragraph of the default corpus (`python -m data.prepare text
--documents=paragraphs --context=64`: 2 to 65 tokens; at context 64, 70% of the records are a full window of
a longer paragraph, so nearly every batch holds one; `--context=256` makes fewer full windows). Three ways to
batch them, each a `data.feature_training_dataset` handed to towerflow's `build` (the task's model and loss;
momentum SGD):

  buckets      padded per batch to the smallest of the feature's buckets (8, 16, 32, 64, 65 at context 64)
               holding its longest: what the pipeline does now
  max_length   every batch padded to context + 1 (buckets = (max_length,))
  grouped      the buckets, after length grouping (`group_batches=P`: pools of P batches sorted by length)

The three train in one process in alternating windows (A, B, C, A, B, C, ...; median of each). A window's
real tokens are counted exactly: a twin iterator of the same dataset yields the batches the window trained on.
Prints each way's real tokens/s and the fraction of computed target positions that are real, then the ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.harness import paths, timing

WAYS = ("buckets", "max_length", "grouped")
CONTEXT = 64  # the default; --context changes how many paragraphs are cut into full windows


def write_records(out_dir: str, context: int = CONTEXT) -> str:
    """The default corpus's paragraph records for `context` in `out_dir` (a subprocess: data.prepare's own
    checks); returns the directory's train glob."""
    from data import text

    corpus = os.path.join(out_dir, "pydoc-topics.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(text.default_corpus()[0])
    records = os.path.join(out_dir, "records")
    command = [sys.executable, "-m", "data.prepare", "text", corpus, records, "--tokens=char",
               f"--context={context}", "--documents=paragraphs"]  # fmt: skip
    subprocess.run(command, cwd=paths.REPO_ROOT, check=True, capture_output=True)
    return os.path.join(records, "train-*.tfrecord")


def datasets(task, train_glob: str, batch_size: int, pool: int) -> dict:
    """way -> a function making that way's training dataset (a fresh one per call, same batches)."""
    import data
    from data import text

    feature = task.features()[text.TOKENS_KEY]
    schemas = {
        "buckets": task.features(),
        "max_length": {text.TOKENS_KEY: dataclasses.replace(feature, buckets=(feature.max_length,))},
        "grouped": task.features(),
    }
    groups = {"buckets": 0, "max_length": 0, "grouped": pool}

    def make(way):
        info = data.inspect_feature_records(train_glob, data.FeatureSchema.of(schemas[way], task.name))
        stream = data.Stream(batch_size=batch_size, seed=0)
        return lambda: data.feature_training_dataset(info, stream, task.preprocess, group_batches=groups[way])

    return {way: make(way) for way in WAYS}


class Way:
    """towerflow trained on one way's batches; `window(steps)` returns (seconds, real target tokens)."""

    def __init__(self, config, make_dataset, streams: int):
        from trainer.loop.build import build

        self.updater = build(config, train_dataset=make_dataset()).updater
        self.twin = iter(make_dataset())  # every stream reads its own copy: each step takes the next micro-batch
        self.streams = streams
        self.computed = self.real = 0

    def window(self, steps: int) -> tuple[float, int]:
        start = time.perf_counter()
        float(self.updater.train_steps(steps).loss)  # waits for the last step
        seconds = time.perf_counter() - start
        real = 0
        for _ in range(steps):
            batch = next(self.twin)
            lengths = batch["tokens_length"].numpy() - 1
            real += int(lengths.sum()) * self.streams
            self.computed += (batch["tokens"].shape[1] - 1) * len(lengths) * self.streams
        self.real += real
        return seconds, real


def build_ways(towers: int, batch: int, pool: int, model_dir: str, context: int = CONTEXT) -> dict[str, Way]:
    """The three ways, built (not yet traced)."""
    import tasks
    from benchmarks.harness import reference
    from trainer.settings import config as cfg

    train_glob = write_records(model_dir, context)
    config = cfg.RunConfig(
        data=cfg.DataConfig(train_data=train_glob, eval_data=train_glob.replace("train-*", "eval-*")),
        task=cfg.TaskConfig(name="lm", options={"context": context}),
        optimizer=cfg.OptimizerConfig(name="momentum", learning_rate=reference.LEARNING_RATE, schedule="constant"),
        towers=cfg.TowerConfig(num_towers=towers, device="cpu", parameter_device="cpu", global_batch_size=batch),
        loop=cfg.LoopConfig(model_dir=os.path.join(model_dir, "run"), train_steps=10**9),
        seed=reference.SEED,
    )
    task = tasks.make_task(config)
    makers = datasets(task, train_glob, batch // towers, pool)
    return {way: Way(config, makers[way], towers) for way in WAYS}


def measure(ways: dict[str, Way], windows: int, window_sec: float, warmup_steps: int) -> dict[str, list[float]]:
    """way -> real tokens/s of each timed window, after `warmup_steps` per way (long enough to meet every padded
    length, so no timed window traces) and a window per way that calibrates the windows' steps."""
    for w in ways.values():
        w.window(warmup_steps)
    per_step = max(w.window(4)[0] / 4 for w in ways.values())
    steps = timing.calibrate(per_step, window_sec, min_steps=2)
    rates = {way: [] for way in ways}
    for _ in range(windows):
        for way, w in ways.items():
            rates[way].append(timing.rate(w.window, steps))
    return rates


def report(ways: dict[str, Way], rates: dict[str, list[float]]) -> list[str]:
    """The table's lines: per way its median real tokens/s and real fraction, then the three ratios."""
    median = {way: statistics.median(r) for way, r in rates.items()}
    lines = [f"{'way':12s} {'real tokens/s':>14s} {'real / computed':>16s}"]
    for way, w in ways.items():
        lines.append(f"{way:12s} {median[way]:14,.0f} {w.real / w.computed:16.3f}")
    for a, b in (("buckets", "max_length"), ("grouped", "max_length"), ("grouped", "buckets")):
        lines.append(f"{a}_vs_{b}: {median[a] / median[b]:.3f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes lm_padding", description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, default=7, help="timed windows per way")
    parser.add_argument("--window_sec", type=float, default=1.0, help="seconds a window aims at")
    parser.add_argument("--towers", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32, help="global batch (sequences)")
    parser.add_argument("--pool", type=int, default=16, help="grouped: batches per length-sorted pool")
    parser.add_argument("--context", type=int, default=CONTEXT, help="the model's context (records of up to +1)")
    args = parser.parse_args(argv)
    print(f"load average at start {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="towerflow-lm-padding-") as work:
        ways = build_ways(args.towers, args.batch, args.pool, work, args.context)
        rates = measure(ways, args.windows, args.window_sec, warmup_steps=3 * args.pool)
        for way in WAYS:
            ways[way].updater.close()
    print("\n".join(report(ways, rates)))
    print(f"load average at end {os.getloadavg()[0]:.2f}")
