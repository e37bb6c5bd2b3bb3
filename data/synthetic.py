"""Learnable synthetic data: every class has a fixed random template, an example is its template plus noise.

A model can fit it (the classes are separable given enough pixels or dimensions), unlike pure noise, so
end-to-end tests can assert that the loss falls. numpy only; writing is `data.writer`'s job.

`synthetic_splits` draws pixel-noise templates (fine for PNG and small images). `photo_splits` draws smooth
templates (a few low-frequency waves per channel) plus mild noise: like photos, they compress, so a
500x375 JPEG at quality 95 is ~100 KB (ImageNet's mean is ~110 KB), where pixel noise would give ~300 KB
and make every JPEG benchmark decode-bound on entropy coding that real data does not have.
"""

from __future__ import annotations

import numpy as np

# Noise scale relative to the templates: visible, yet the nearest template is right almost always.
IMAGE_NOISE_STDDEV = 40.0  # templates are uniform in 0..255
DENSE_NOISE_STDDEV = 0.5  # templates are standard normal
# photo_splits: per-pixel noise on smooth templates; 10 gives ~100 KB JPEGs at 500x375 (8: ~95 KB, 16: ~128 KB).
PHOTO_NOISE_STDDEV = 10.0
_PHOTO_WAVES = 6  # cosine waves per channel of a template

Split = tuple[np.ndarray, np.ndarray]


def synthetic_splits(
    shape: tuple[int, ...], num_classes: int, num_train: int, num_eval: int, seed: int = 0
) -> tuple[Split, Split]:
    """Makes train and eval examples from the same class templates (eval is held-out noise, not new classes).

    Args:
        shape: (H, W, C) for uint8 images, or (D,) for float32 vectors.
        num_classes: Number of classes (templates).
        num_train: Number of train examples.
        num_eval: Number of eval examples.
        seed: Seed of numpy's default_rng; the same seed gives the same arrays.

    Returns:
        ((train_x, train_y), (eval_x, eval_y)); x is uint8 (N, H, W, C) or float32 (N, D), y is int64 (N,)
        in [0, num_classes).
    """
    rng = np.random.default_rng(seed)
    if len(shape) == 3:
        templates = rng.integers(0, 256, size=(num_classes, *shape)).astype(np.float32)
        noise_stddev = IMAGE_NOISE_STDDEV
    else:
        templates = rng.standard_normal((num_classes, *shape)).astype(np.float32)
        noise_stddev = DENSE_NOISE_STDDEV
    splits = []
    for count in (num_train, num_eval):
        labels = rng.integers(0, num_classes, size=count).astype(np.int64)
        examples = templates[labels] + rng.normal(0.0, noise_stddev, size=(count, *shape)).astype(np.float32)
        if len(shape) == 3:
            examples = np.clip(np.rint(examples), 0, 255).astype(np.uint8)
        splits.append((examples, labels))
    return splits[0], splits[1]


def photo_splits(
    shape: tuple[int, int, int], num_classes: int, num_train: int, num_eval: int, seed: int = 0
) -> tuple[Split, Split]:
    """Like `synthetic_splits` for images, with smooth, compressible (photo-like) class templates.

    Each class's template is a base colour plus `_PHOTO_WAVES` cosine waves per channel (1 to 8 periods
    across the image), drawn from (seed, class); an example adds Gaussian noise of PHOTO_NOISE_STDDEV. Templates
    are computed per example, so memory is that of the uint8 outputs whatever num_classes is.

    Returns:
        ((train_x, train_y), (eval_x, eval_y)): x uint8 (N, H, W, C), y int64 (N,) in [0, num_classes).
    """
    rng = np.random.default_rng(seed)
    splits = []
    for count in (num_train, num_eval):
        labels = rng.integers(0, num_classes, size=count).astype(np.int64)
        images = np.empty((count, *shape), np.uint8)
        for i, label in enumerate(labels):
            noisy = _smooth_template(shape, seed, int(label)) + rng.normal(0.0, PHOTO_NOISE_STDDEV, size=shape)
            images[i] = np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
        splits.append((images, labels))
    return splits[0], splits[1]


def _smooth_template(shape: tuple[int, int, int], seed: int, label: int) -> np.ndarray:
    height, width, channels = shape
    rng = np.random.default_rng([seed, label])
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]
    template = np.empty(shape, np.float32)
    for c in range(channels):
        plane = np.full((height, width), rng.uniform(40, 215), np.float32)
        for _ in range(_PHOTO_WAVES):
            periods_y, periods_x = rng.uniform(0.5, 8.0, size=2) * rng.choice([-1, 1], size=2)
            phase, amplitude = rng.uniform(0, 2 * np.pi), rng.uniform(5, 30)
            plane += amplitude * np.cos(2 * np.pi * (periods_y * y + periods_x * x) + phase)
        template[..., c] = plane
    return template
