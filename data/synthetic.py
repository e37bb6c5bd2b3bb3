"""Learnable synthetic data: every class has a fixed random template, an example is its template plus noise.

A model can fit it (the classes are separable given enough pixels or dimensions), unlike pure noise, so
end-to-end tests can assert that the loss falls. numpy only; writing is `data.writer`'s job.
"""

from __future__ import annotations

import numpy as np

# Noise scale relative to the templates: visible, yet the nearest template is right almost always.
IMAGE_NOISE_STDDEV = 40.0  # templates are uniform in 0..255
DENSE_NOISE_STDDEV = 0.5  # templates are standard normal

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
