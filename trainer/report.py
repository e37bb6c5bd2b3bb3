"""What a run leaves for people and tools: `metrics.json`, `flags.txt`, and the weights hash."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os

import numpy as np


def weights_sha256(variables) -> str:
    """SHA-256 over the bytes of every variable, in the order given.

    The trainer passes `model.variables`: Keras's tracking order (layers in model order, each layer's
    variables in creation order, non-trainable state such as BatchNorm moving statistics included). Each
    variable contributes its value as a C-ordered numpy array's raw bytes, nothing else (no names, so renamed
    layers hash the same).
    """
    digest = hashlib.sha256()
    for variable in variables:
        digest.update(np.ascontiguousarray(np.asarray(variable.numpy())).tobytes())
    return digest.hexdigest()


def write_json(path: str, values) -> None:
    """Writes `values` as strict, indented JSON (NaN and infinities become null), atomically (a reader never
    sees a half-written file)."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(_strict(values), f, indent=2, sort_keys=True, default=_plain, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)  # a full disk leaves no half-written .tmp behind
        raise


def write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _strict(value):
    """`value` with every non-finite float replaced by None: JSON has no NaN, and strict parsers refuse it."""
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
