"""The records the input figures read, and how long they time: ImageNet-sized synthetic JPEGs, and the sizes.

Shared by `benchmarks.input.figures` (the headline table's input rows) and `benchmarks.input.alone`
(`python -m benchmarks --input`), which both time pipelines over the same records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os

SHAPE = (375, 500, 3)
NUM_CLASSES = 1000


@dataclasses.dataclass(frozen=True)
class InputSize:
    name: str
    num_records: int
    batch_size: int
    warmup_batches: int
    windows: int
    batches_per_window: int


# A window is one epoch of the records (num_records / batch_size batches): towerflow's pipeline reads and
# shuffles each epoch's records before its first batch, a cost paid once per record that a shorter window
# would see in some windows and not others. The warm-up is one epoch too (autotuning settles in it).
SIZES = {
    "full": InputSize("full", num_records=512, batch_size=32, warmup_batches=16, windows=5, batches_per_window=16),
    "smoke": InputSize("smoke", num_records=8, batch_size=4, warmup_batches=2, windows=1, batches_per_window=2),
}
# 32x32 records: the resnet20-synth setting's 2048, its batch of 64; a window is 4 epochs (an epoch of cached
# 32x32 images takes ~0.1 s, too short to time on a shared machine).
SMALL_SETTING = "resnet20-synth"
SMALL_SIZES = {
    "full": InputSize("full", num_records=2048, batch_size=64, warmup_batches=32, windows=5, batches_per_window=128),
    "smoke": InputSize("smoke", num_records=2048, batch_size=16, warmup_batches=2, windows=1, batches_per_window=4),
}


def write_jpegs(out_dir: str, num_records: int) -> str:
    """Writes `num_records` synthetic JPEG records with data.prepare; returns the train glob."""
    from data import prepare

    args = ["synthetic", out_dir, "--format=jpeg", f"--shape={','.join(map(str, SHAPE))}"]
    args += [f"--num_classes={NUM_CLASSES}", f"--num_examples={num_records}", "--eval_examples=1"]
    with contextlib.redirect_stdout(io.StringIO()):
        if prepare.main(args) != 0:
            raise RuntimeError(f"python -m data.prepare {' '.join(args)} failed")
    return os.path.join(out_dir, "train-*")
