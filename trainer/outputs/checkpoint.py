"""Checkpoints: model, optimizer, global step and the input positions, through `tf.train.CheckpointManager`.

Saving each input stream's position (`trainer.loop.inputs.PlacedIterator`) means a resumed run reads exactly the
batches the uninterrupted run would have read, which the determinism contract needs.

A week-long run meets nodes killed mid-save and files that rot, so a resume takes the newest checkpoint that
reads back whole and says which newer ones it skipped and why; a missing or garbled `checkpoint` state file is
rebuilt from the checkpoints on disk; what interrupted saves leave is removed. A checkpoint that reads back
whole but does not fit this run (another model or optimizer) still fails: the older checkpoints of the same
directory would not fit either, and falling back to one would hide the mistake.
"""

from __future__ import annotations

import logging
import os

import tensorflow as tf

from trainer.outputs import checkpoint_files as files
from trainer.system.files import literal_dir


class _MultiTaskSaveRetracing(logging.Filter):
    """Drops TensorFlow's "N out of the last N calls to <function MultiDeviceSaver.save.<locals>.tf_function_save>
    triggered tf.function retracing" warning. When the saved state spans several tasks (the workers' input
    positions), TensorFlow's saver builds a new `tf.function` for every save on purpose (functional_saver.py:
    "this will cause a function re-trace on each save ... needed to ensure we pick up the latest values of
    options"), so from the fifth save of a process on the warning fires for every save: noise, not a fault of
    the run. Every other retracing warning still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("MultiDeviceSaver.save" in message and "triggered tf.function retracing" in message)


_RETRACING_FILTER = _MultiTaskSaveRetracing()


class _RefusedRestore(logging.Filter):
    """Once a restore was refused (`CheckpointMismatch`, which names the checkpoint and what differs), drops the
    warnings TensorFlow logs when that restore's state is garbage-collected ("Detecting that an object ... is
    being deleted with unrestored values", then a line per value, from its checkpoint.py): they repeat the
    refusal in TensorFlow's words, after it, as the process ends. Before a refusal, nothing is dropped."""

    UNRESTORED = (
        "Detecting that an object or model or tf.train.Checkpoint is being deleted with unrestored values",
        "Value in checkpoint could not be found in the restored object",
        "An attribute in the restored object could not be found in the checkpoint",
    )

    def __init__(self):
        super().__init__()
        self.refused = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.refused and record.getMessage().startswith(self.UNRESTORED))


_REFUSED_FILTER = _RefusedRestore()


class CheckpointMismatch(RuntimeError):
    """A checkpoint reads back whole but does not fit this run's model, optimizer or data."""


class Checkpointer:
    """Saves and restores the training state in `model_dir`.

    Args:
      model_dir: directory of the run; checkpoints are `model_dir/checkpoints/ckpt-<step>` (see
        `trainer.outputs.checkpoint_files` for why not in `model_dir` itself).
      keep: how many of the newest checkpoints to keep.
      step: the global step variable; checkpoints are numbered by it.
      log: callable taking one line of text: what a resume skipped, repaired or removed.
      **objects: trackables to save (model=..., optimizer=..., iterator=...).
    """

    def __init__(self, model_dir: str, keep: int, step: tf.Variable, log=print, **objects):
        self.model_dir = model_dir
        self.directory = files.directory(model_dir)
        self.keep = keep
        self.step = step
        self.log = log
        self.checkpoint = tf.train.Checkpoint(step=step, **objects)
        tf.get_logger().addFilter(_RETRACING_FILTER)  # once per process: adding the same filter again is a no-op
        tf.get_logger().addFilter(_REFUSED_FILTER)
        self.saved_step: int | None = None  # the step of the checkpoint restored or last saved
        self._manager: tf.train.CheckpointManager | None = None

    @property
    def manager(self) -> tf.train.CheckpointManager:
        """Built on first use: it reads the state file once, so only after `restore_latest` repaired it."""
        if self._manager is None:
            self._manager = tf.train.CheckpointManager(
                self.checkpoint, self._tf_directory(), max_to_keep=self.keep, step_counter=self.step
            )
        return self._manager

    @property
    def latest_checkpoint(self) -> str | None:
        """The newest checkpoint the manager knows of (restored or saved), or None."""
        return self._real(self.manager.latest_checkpoint)

    def _tf_directory(self) -> str:
        """`directory` as TensorFlow's own calls must name it: TensorFlow globs checkpoint paths, so a
        `--model_dir` holding `[`, `*` or `?` would find, restore and rotate away no checkpoint."""
        return literal_dir(self.directory)

    def _real(self, path: str | None) -> str | None:
        """A path TensorFlow returned (under `_tf_directory()`) as the path under `directory`."""
        alias = self._tf_directory()
        if path is None or alias == self.directory or not path.startswith(alias + os.sep):
            return path
        return os.path.join(self.directory, path[len(alias) + 1 :])

    def restore_latest(self) -> str | None:
        """Restores the newest checkpoint that reads back whole, if any; returns its path.

        First moves the checkpoints of a run that kept them in `model_dir` into `checkpoints/`, removes what
        interrupted saves left and repairs the state file (a missing or garbled one is
        rebuilt from the checkpoints on disk), saying so through `log`. Newer checkpoints that do not read back
        whole are skipped, each with a line saying why; they are the first to be rotated away. With none that
        reads back whole, the run starts from step 0.

        Raises:
          CheckpointMismatch: (a RuntimeError) the newest checkpoint that reads back whole does not fit this
            run; the message names it and what differs. No older checkpoint is tried.
          tf.errors.OpError: the storage cannot be read now (permission denied, unavailable, ...).
        """
        self._manager = None
        if os.path.isdir(self.model_dir):
            moved = files.move_from_model_dir(self.model_dir)
            if moved:
                self.log(f"moved the checkpoint files {', '.join(moved)} from {self.model_dir} to {self.directory}")
        candidates = _tidy(self.directory, self.log) if os.path.isdir(self.directory) else []
        skipped = []
        for name in sorted(candidates, key=files.number, reverse=True):
            problem = files.unreadable(os.path.join(self._tf_directory(), name))
            if problem is None:
                path = self._restore(name)
                if skipped:
                    self._rotate_away_first(skipped, candidates)
                    self.log(f"resuming from {name}, the newest checkpoint that reads back whole")
                return path
            self.log(f"skipped checkpoint {name}: {problem.replace(self._tf_directory(), self.directory)}")
            skipped.append(name)
        if skipped:
            self._rotate_away_first(skipped, candidates)
            self.log(f"no checkpoint in {self.directory} reads back whole; starting from step 0")
        return None

    def _restore(self, name: str) -> str:
        path = os.path.join(self.directory, name)
        try:
            self.checkpoint.restore(os.path.join(self._tf_directory(), name)).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            # It read back whole (`files.unreadable`), so this is not damage: it was written by another run.
            _REFUSED_FILTER.refused = True
            raise CheckpointMismatch(
                f"cannot resume from {path}: it reads back whole but does not match this run's "
                f"model/optimizer/data ({type(e).__name__}: {e}). Use a new --model_dir, or the flags of the run "
                f"that wrote it (the first start in {os.path.join(self.model_dir, 'flags.history')})."
            ) from e
        self.saved_step = int(self.step.numpy())
        return path

    def _rotate_away_first(self, skipped: list[str], candidates: list[str]) -> None:
        """Lists the skipped checkpoints as the oldest in the state file, so the manager deletes them first
        (or overwrites them when it saves their step again) and never takes one for the newest."""
        skipped = sorted(skipped, key=files.number)
        state, _ = files.read_state(self.directory)
        names = skipped + [n for n in candidates if n not in skipped]
        files.write_state(self.directory, names, state.timestamps if state else {})

    def save(self) -> str:
        """Saves at the current step (a no-op when that step is the one restored or last saved); returns the
        path."""
        step = int(self.step.numpy())
        if step == self.saved_step:
            return os.path.join(self.directory, f"ckpt-{step}")
        path = self._real(self.manager.save(checkpoint_number=step))
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
