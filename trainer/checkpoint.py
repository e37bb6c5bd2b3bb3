"""Checkpoints: model, optimizer, global step and the input iterator, through `tf.train.CheckpointManager`.

Saving the tf.data iterator (shuffle buffer included) means a resumed run reads exactly the batches the
uninterrupted run would have read, which the determinism contract needs.
"""

from __future__ import annotations

import os

import tensorflow as tf


class Checkpointer:
    """Saves and restores the training state in `model_dir`.

    Args:
      model_dir: directory of the run; checkpoints are `model_dir/ckpt-<step>`.
      keep: how many of the newest checkpoints to keep.
      **objects: trackables to save (model=..., optimizer=..., step=..., iterator=...).
    """

    def __init__(self, model_dir: str, keep: int, step: tf.Variable, **objects):
        self.step = step
        self.checkpoint = tf.train.Checkpoint(step=step, **objects)
        self.manager = tf.train.CheckpointManager(self.checkpoint, model_dir, max_to_keep=keep, step_counter=step)

    def restore_latest(self) -> str | None:
        """Restores the newest checkpoint, if any; returns its path.

        Raises:
          RuntimeError: the checkpoint does not match this run (another model or optimizer), naming the path.
        """
        path = self.manager.latest_checkpoint
        if path is None:
            return None
        try:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            raise RuntimeError(
                f"cannot resume from {path}: it does not match this run's model/optimizer/data ({e}). "
                f"Use a new --model_dir, or the flags of the run that wrote it ({_flags_hint(path)})."
            ) from e
        return path

    def save(self) -> str:
        """Saves at the current step (a no-op when that step is already saved); returns the path."""
        step = int(self.step.numpy())
        latest = self.manager.latest_checkpoint
        if latest is not None and latest.endswith(f"-{step}"):
            return latest
        return self.manager.save(checkpoint_number=step)


def _flags_hint(path: str) -> str:
    return os.path.join(os.path.dirname(path), "flags.txt")
