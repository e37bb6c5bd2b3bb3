"""A small real data set for tests and examples: the 8x8 handwritten digits as image TFRecords.

1797 grayscale images (8, 8, 1), labels 0..9, with a FIXED held-out split: the permutation of
np.random.default_rng(0), whose last 360 examples (20%) are eval and the other 1437 train. Train is written
in 4 PNG shards, eval in 1. Needs no network: the data ships with towerflow (`digits.csv.gz`, 57 KB).

The data is the test set of the UCI "Optical Recognition of Handwritten Digits" data set (E. Alpaydin and
C. Kaynak, 1998; CC BY 4.0: https://archive.ics.uci.edu/dataset/80), in the file scikit-learn (BSD-3-Clause)
bundles as sklearn/datasets/data/digits.csv.gz and reads with `load_digits()`: one row per image, 64 pixels
of 0..16 and the label. towerflow reads the same file the same way, byte for byte the arrays `load_digits()`
gives (tests/data/test_data_prepare.py), without importing scikit-learn: Keras imports it whenever it is
installed, and `import tensorflow, keras` took 5.6 CPU-seconds with it, 3.8 without.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import shutil
import tempfile

import numpy as np

from data.schema import DataError

NUM_CLASSES = 10
NUM_EVAL = 360
TRAIN_SHARDS = 4
EVAL_SHARDS = 1
CACHE_NAME = "digits-v1"  # bump the version when the content or the split changes

TRAIN_PATTERN = f"train-*-of-{TRAIN_SHARDS:05d}"
EVAL_PATTERN = f"eval-*-of-{EVAL_SHARDS:05d}"
_INFO_FILE = "info.json"
_CSV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.csv.gz")


def default_cache_dir() -> str:
    """Returns `$TOWERFLOW_CACHE/digits-v1` if TOWERFLOW_CACHE is set, else `~/.cache/towerflow/digits-v1`."""
    root = os.environ.get("TOWERFLOW_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "towerflow")
    return os.path.join(root, CACHE_NAME)


def digits_splits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Loads the digits and splits them.

    Returns:
        ((train_images, train_labels), (eval_images, eval_labels)): images uint8 (N, 8, 8, 1) with pixel
        values round(v * 255 / 16) of the original 0..16, labels int64 (N,) in 0..9; N = 1437 and 360.
    """
    pixels, labels = load_digits()
    images = np.rint(pixels * 255.0 / 16.0).astype(np.uint8)[..., np.newaxis]
    order = np.random.default_rng(0).permutation(len(labels))
    train, held_out = order[:-NUM_EVAL], order[-NUM_EVAL:]
    return (images[train], labels[train]), (images[held_out], labels[held_out])


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 digits as scikit-learn's `load_digits()` gives them: (images float64 (1797, 8, 8) of 0..16,
    labels int64 (1797,)), in the file's order."""
    with gzip.open(_CSV) as f:
        rows = np.loadtxt(f, delimiter=",")
    return rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(np.int64)


def write_digits(out_dir: str) -> tuple[str, str]:
    """Writes the digits into out_dir: train-*-of-00004, eval-00000-of-00001, info.json, README.txt.

    Args:
        out_dir: Directory to write into; made if missing. Files already there are overwritten.

    Returns:
        (train_glob, eval_glob) inside out_dir.
    """
    from data import writer  # imports TensorFlow; the cache hit in ensure_digits must not pay for it

    (train_images, train_labels), (eval_images, eval_labels) = digits_splits()
    os.makedirs(out_dir, exist_ok=True)
    writer.write_image_records(os.path.join(out_dir, "train"), train_images, train_labels, num_shards=TRAIN_SHARDS)
    writer.write_image_records(os.path.join(out_dir, "eval"), eval_images, eval_labels, num_shards=EVAL_SHARDS)
    info = {
        "name": "digits",
        "source": "data/digits.csv.gz (UCI optical digits, test set; as sklearn's load_digits()); "
        "pixels round(v * 255 / 16); eval = last 360 of "
        "np.random.default_rng(0).permutation(1797)",
        "schema": "image",
        "image_format": "png",
        "shape": [8, 8, 1],
        "num_classes": NUM_CLASSES,
        "counts": {"train": len(train_labels), "eval": len(eval_labels)},
        "files": {"train": TRAIN_PATTERN, "eval": EVAL_PATTERN},
    }
    with open(os.path.join(out_dir, "README.txt"), "w") as f:
        f.write(
            "The UCI 8x8 handwritten digits as ImageNet-style image TFRecords (PNG, 8x8x1, labels 0..9), "
            "written by towerflow's data.digits.\n"
            f"train: {len(train_labels)} examples in {TRAIN_PATTERN}\n"
            f"eval:  {len(eval_labels)} examples in {EVAL_PATTERN}\n"
        )
    # info.json last: its presence marks a complete directory.
    with open(os.path.join(out_dir, _INFO_FILE), "w") as f:
        json.dump(info, f, indent=2)
    return _globs(out_dir)


def ensure_digits(cache_dir: str | None = None) -> tuple[str, str]:
    """Returns the digits' record globs, building the cache directory on first use.

    The directory is built in a temporary directory next to it and moved into place with os.replace, so a
    crash never leaves a half-written cache and concurrent builders (e.g. parallel tests) agree on one.

    Args:
        cache_dir: The cache directory; None means `default_cache_dir()`.

    Returns:
        (train_glob, eval_glob): absolute globs of 4 train shards (1437 examples) and 1 eval shard (360).

    Raises:
        DataError: If cache_dir exists but is not a complete digits cache (delete it to rebuild).
    """
    cache_dir = os.path.abspath(cache_dir or default_cache_dir())
    if _is_complete(cache_dir):
        return _globs(cache_dir)
    parent = os.path.dirname(cache_dir)
    os.makedirs(parent, exist_ok=True)
    building = tempfile.mkdtemp(prefix=f".{os.path.basename(cache_dir)}.building-", dir=parent)
    try:
        os.chmod(building, 0o755)  # mkdtemp makes it private (0700); the cache may be shared
        write_digits(building)
        try:
            os.replace(building, cache_dir)
        except OSError as e:
            # Another process finished first (rename cannot replace a non-empty directory): use its copy.
            if not _is_complete(cache_dir):
                raise DataError(
                    f"digits cache {cache_dir} exists but is incomplete or not a digits cache; delete it and retry"
                ) from e
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return _globs(cache_dir)


def _globs(directory: str) -> tuple[str, str]:
    return os.path.join(directory, TRAIN_PATTERN), os.path.join(directory, EVAL_PATTERN)


def _is_complete(directory: str) -> bool:
    train_glob, eval_glob = _globs(directory)
    return (
        os.path.isfile(os.path.join(directory, _INFO_FILE))
        and len(glob.glob(train_glob)) == TRAIN_SHARDS
        and len(glob.glob(eval_glob)) == EVAL_SHARDS
    )
