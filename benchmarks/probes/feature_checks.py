"""`python -m benchmarks.probes feature_checks [--windows=9] [--batches=60]`: what a task's record checks cost
the training input pipeline.

A feature that declares `bounds` has every value checked, and one that is not `optional` has every record
with an empty list looked into for its key (`data.feature_pipeline`), per record, before the model sees it.
This times the same records through two pipelines in one process, in alternating windows so that load on the
machine falls on both sides alike: `checked` (`Feature("int64", max_length=256, bounds=(0, 256))`) against
`unchecked` (the same feature `optional`, no bounds: only the max_length check every pipeline has). Each
window's figure is examples per CPU-second of the process (tf.data's threads included), so another process
on the machine does not count; the ratio checked / unchecked is the median of the windows' ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

import data
from data.schema import Feature, FeatureSchema

RECORDS_PER_FILE, FILES, BATCH = 5000, 4, 128


def _write(folder: str) -> str:
    """Four files of 5,000 records, each a list of 1-256 ids in [0, 256) and a label."""
    rng = np.random.default_rng(0)
    schema = FeatureSchema.of({"tokens": Feature("int64", max_length=256), "y": Feature("int64")}, "probe")
    for f in range(FILES):
        examples = [
            {"tokens": rng.integers(0, 256, rng.integers(1, 257)).tolist(), "y": [int(rng.integers(0, 3))]}
            for _ in range(RECORDS_PER_FILE)
        ]
        data.write_feature_records(os.path.join(folder, f"train-{f}"), examples, schema)
    return os.path.join(folder, "train-*")


def _dataset(pattern: str, tokens: Feature):
    schema = FeatureSchema.of({"tokens": tokens, "y": Feature("int64")}, "probe")
    info = data.inspect_feature_records(pattern, schema)
    return data.feature_training_dataset(info, data.Stream(batch_size=BATCH), lambda e, s, training: e)


def _window(dataset, batches: int) -> float:
    """Examples per CPU-second of `batches` batches from a fresh iterator, after 10 to fill its buffers; the
    iterator is dropped after (its threads stop), so one side's prefetching never runs in the other's window."""
    iterator = iter(dataset)
    for _ in range(10):
        next(iterator)
    start = time.process_time()
    for _ in range(batches):
        next(iterator)
    seconds = time.process_time() - start
    del iterator
    return batches * BATCH / seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.probes feature_checks", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--windows", type=int, default=9, help="alternating windows per side")
    parser.add_argument("--batches", type=int, default=60, help=f"batches of {BATCH} per window")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="towerflow-feature-checks-") as folder:
        pattern = _write(folder)
        checked = _dataset(pattern, Feature("int64", max_length=256, bounds=(0, 256)))
        unchecked = _dataset(pattern, Feature("int64", max_length=256, optional=True))
        pairs = [(_window(checked, args.batches), _window(unchecked, args.batches)) for _ in range(args.windows)]
    a, b = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    ratios = sorted(x / y for x, y in pairs)
    print(f"checked   {a:9,.0f} examples per CPU-second (median of {args.windows} windows)")
    print(f"unchecked {b:9,.0f} examples per CPU-second")
    print(f"ratio checked / unchecked {statistics.median(ratios):.3f} (windows {ratios[0]:.3f}-{ratios[-1]:.3f})")


if __name__ == "__main__":
    main()
