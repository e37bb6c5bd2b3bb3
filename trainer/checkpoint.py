"""Checkpoints: model, optimizer, global step and the input iterator, through `tf.train.CheckpointManager`.

Saving the tf.data iterator (shuffle buffer included) means a resumed run reads exactly the batches the
uninterrupted run would have read, which the determinism contract needs.

A week-long run meets nodes killed mid-save and files that rot, so a resume takes the newest checkpoint that
reads back whole and says which newer ones it skipped and why; a missing or garbled `checkpoint` state file is
rebuilt from the checkpoints on disk; what interrupted saves leave is removed. A checkpoint that reads back
whole but does not fit this run (another model or optimizer) still fails: the older checkpoints of the same
directory would not fit either, and falling back to one would hide the mistake.
"""

from __future__ import annotations

import os

import tensorflow as tf

from trainer import checkpoint_files as files


class CheckpointMismatch(RuntimeError):
    """A checkpoint reads back whole but does not fit this run's model, optimizer or data."""


class Checkpointer:
    """Saves and restores the training state in `model_dir`.

    Construction removes the leftovers of interrupted saves and repairs the state file (both logged), before
    the `tf.train.CheckpointManager` reads that file.

    Args:
      model_dir: directory of the run; checkpoints are `model_dir/ckpt-<step>`.
      keep: how many of the newest checkpoints to keep.
      step: the global step variable; checkpoints are numbered by it.
      log: callable taking one line of text: what was skipped, repaired or removed.
      **objects: trackables to save (model=..., optimizer=..., iterator=...).
    """

    def __init__(self, model_dir: str, keep: int, step: tf.Variable, log=print, **objects):
        self.model_dir = model_dir
        self.keep = keep
        self.step = step
        self.log = log
        self.checkpoint = tf.train.Checkpoint(step=step, **objects)
        self.candidates = _tidy(model_dir, log) if os.path.isdir(model_dir) else []
        self.saved_step: int | None = None  # the step of the checkpoint restored or last saved
        self.manager = self._new_manager()

    def _new_manager(self) -> tf.train.CheckpointManager:
        return tf.train.CheckpointManager(
            self.checkpoint, self.model_dir, max_to_keep=self.keep, step_counter=self.step
        )

    def restore_latest(self) -> str | None:
        """Restores the newest checkpoint that reads back whole, if any; returns its path.

        Newer checkpoints that do not read back whole are skipped, each with a line to `log` saying why; they
        are the first to be rotated away. With none that reads back whole, the run starts from step 0.

        Raises:
          CheckpointMismatch: (a RuntimeError) the newest checkpoint that reads back whole does not fit this
            run; the message names it and what differs. No older checkpoint is tried.
          tf.errors.OpError: the storage cannot be read now (permission denied, unavailable, ...).
        """
        skipped = []
        for name in sorted(self.candidates, key=files.number, reverse=True):
            problem = files.unreadable(os.path.join(self.model_dir, name))
            if problem is None:
                return self._restore(name, skipped)
            self.log(f"skipped checkpoint {name}: {problem}")
            skipped.append(name)
        if skipped:
            self._rotate_away_first(skipped)
            self.log(f"no checkpoint in {self.model_dir} reads back whole; starting from step 0")
        return None

    def _restore(self, name: str, skipped: list[str]) -> str:
        path = os.path.join(self.model_dir, name)
        try:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            # It read back whole (`files.unreadable`), so this is not damage: it was written by another run.
            raise CheckpointMismatch(
                f"cannot resume from {path}: it reads back whole but does not match this run's "
                f"model/optimizer/data ({type(e).__name__}: {e}). Use a new --model_dir, or the flags of the run "
                f"that wrote it ({os.path.join(self.model_dir, 'flags.txt')})."
            ) from e
        self.saved_step = int(self.step.numpy())
        if skipped:
            self._rotate_away_first(skipped)
            self.log(f"resuming from {name}, the newest checkpoint that reads back whole")
        return path

    def _rotate_away_first(self, skipped: list[str]) -> None:
        """Lists the skipped checkpoints as the oldest in the state file, so the manager deletes them first
        (or overwrites them when it saves their step again) and no longer takes them for the newest."""
        skipped = sorted(skipped, key=files.number)
        state, _ = files.read_state(self.model_dir)
        files.write_state(
            self.model_dir, skipped + [n for n in self.candidates if n not in skipped], state.timestamps
        )
        self.manager = self._new_manager()

    def save(self) -> str:
        """Saves at the current step (a no-op when that step is the one restored or last saved); returns the
        path."""
        step = int(self.step.numpy())
        if step == self.saved_step:
            return os.path.join(self.model_dir, f"ckpt-{step}")
        path = self.manager.save(checkpoint_number=step)
        self.saved_step = step
        return path


def _tidy(model_dir: str, log) -> list[str]:
    """Removes the leftovers of interrupted saves and makes the state file list every checkpoint on disk
    (rebuilt when missing or garbled). Returns the checkpoint names the state file lists."""
    state, problem = files.read_state(model_dir)
    recorded = state.names if state else []
    removed = files.remove_leftovers(model_dir, set(recorded))
    if removed:
        log(f"removed what interrupted checkpoint saves left in {model_dir}: {', '.join(removed)}")
    state_file = os.path.join(model_dir, files.STATE_FILE)
    unlisted = [n for n in files.indexed(model_dir) if n not in recorded]
    if state is None and not unlisted:
        if problem != "missing":
            os.remove(state_file)
            log(f"removed the checkpoint state file {state_file}: {problem}, and no checkpoint is on disk")
        return []
    if not unlisted:
        return recorded
    if state is None:
        log(f"the checkpoint state file {state_file} is {problem}; rebuilt it from {', '.join(unlisted)} on disk")
        files.write_state(model_dir, unlisted, {})
        return unlisted
    # Newer ones were saved but not recorded (a kill between the two); older ones were never managed.
    newest = files.number(recorded[-1])
    older = [n for n in unlisted if files.number(n) < newest]
    names = older + recorded + [n for n in unlisted if files.number(n) > newest]
    log(f"added {', '.join(unlisted)} on disk but not in {state_file} to it")
    files.write_state(model_dir, names, state.timestamps)
    return names
