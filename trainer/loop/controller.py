"""The outer loop: step budget, and the cadence of logging, histograms, eval and checkpoints.

The loop never computes a gradient; the update mode never logs or checkpoints. The loop asks the mode for
`n` steps at a time, n being the distance to the next event, so the hot path is a tight run of steps.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import time

import tensorflow as tf

from data.phase import Phase
from trainer.outputs import progress as progress_lib
from trainer.settings.config import LoopConfig
from trainer.step.stepper import Updater
from trainer.system import stop as stop_lib


def is_time(step: int, every_steps: int) -> bool:
    """The one rule for every cadence: an event with period `every_steps` (0 = off) fires at its multiples."""
    return every_steps > 0 and step % every_steps == 0


def steps_to_next_event(step: int, train_steps: int, cadences: list[int], marks=()) -> int:
    """How many steps from `step` to the next cadence event, absolute mark, or the end of training."""
    distances = [every - step % every for every in cadences if every > 0]
    distances += [mark - step for mark in marks if mark > step]
    return min([train_steps - step, *distances])


class Loop:
    """Drives an update mode to `config.train_steps`.

    Args:
      updater: the update mode's `trainer.step.stepper.Updater`.
      config: cadences and budget.
      evaluator: has `evaluate() -> dict` or None.
      checkpointer: has `save()`.
      summaries: `trainer.outputs.summaries.Summaries`.
      histogram_variables / histogram_tags: what the gradient histograms are of.
      log: callable taking one line of text.
      stop: the stop request the loop honours after every step (`trainer.system.stop.REQUEST` by default).
      on_checkpoint: called with the step after every checkpoint save (e.g. to record the attempt).
      before_save: called with the step before every save; raises (e.g. `trainer.system.stop.Diverged`) to prevent it.
      extra_scalars: returns more train scalars to log at every log step (e.g. the bad-record count).
      live_progress: draw a live progress line on stdout (`trainer.outputs.progress`); None: when it is a terminal.
      stall: a `trainer.system.stall.StallWatch` that watches every window of steps (several tasks), or None.
      num_tasks: the tasks the towers are on: a task slower than the others is named (`progress.Stragglers`).

    The first window of every start is one step long and logged, so the console shows the first step (and
    how long its graph tracing took) at once; train scalars are defined in `trainer.outputs.progress`.
    """

    def __init__(
        self,
        updater: Updater,
        config: LoopConfig,
        evaluator,
        checkpointer,
        summaries,
        histogram_variables,
        histogram_tags,
        log=print,
        stop: stop_lib.StopRequest | None = None,
        on_checkpoint=None,
        before_save=None,
        extra_scalars=None,
        live_progress: bool | None = None,
        stall=None,
        num_tasks: int = 1,
    ):
        self.updater = updater
        self.config = config
        self.examples_per_step = updater.examples_per_step
        self.evaluator = evaluator
        self.checkpointer = checkpointer
        self.summaries = summaries
        self.histogram_variables = histogram_variables
        self.histogram_tags = histogram_tags
        self.log = log
        self.throughput = progress_lib.Throughput()  # of this start
        self.last_train: dict = {}
        self.last_eval: dict = {}
        self.stop = stop or stop_lib.REQUEST
        self.on_checkpoint = on_checkpoint or (lambda step: None)
        self.before_save = before_save or (lambda step: None)
        self.extra_scalars = extra_scalars or dict
        self.start_step: int | None = None
        self.training_since: float | None = None  # time.monotonic() when run() began
        self.interval = progress_lib.LogInterval()  # the steps since the previous log line
        self.stall = stall
        self._slow_live, self._slow_logged = progress_lib.Stragglers(num_tasks), progress_lib.Stragglers(num_tasks)
        self._windows = 0  # windows run since this start
        self.progress = None
        if progress_lib.live_progress() if live_progress is None else live_progress:
            self.progress = progress_lib.ProgressLine(
                sys.stdout, config.train_steps, self.examples_per_step, updater.global_step, lambda: updater.latest_loss
            )

    def run(self) -> dict:
        """Trains to the step budget; returns the last train and eval metrics (Python numbers).

        The final checkpoint is written before the final eval, so a signal or a kill during that eval
        loses no training.

        Raises:
          StopRequested: a stop signal arrived; the loop checkpointed at the step boundary after it.
        """
        c = self.config
        cadences = [c.log_every_steps, c.eval_every_steps, c.checkpoint_every_steps, c.histogram_every_steps]
        step = self.start_step = self._step()
        self.training_since = time.monotonic()
        marks = (*(c.profile_steps or ()), step + 1)  # the first step of a start is a window of its own
        # A signal interrupts the mode's call in progress after its step, not after its last step.
        with self.stop.notifying(self.updater.interrupt):
            while step < c.train_steps:
                self._stop_if_requested(step)
                n = steps_to_next_event(step, c.train_steps, cadences, marks)
                ran = self._train_window(step, n)
                step = self._step()
                self._stop_if_requested(step)  # before any event due at this step
                if ran == n:
                    self._events(step)
        self._save(step)
        if not self.last_eval or self.last_eval.get("step") != step:
            self._evaluate(step, final=True)
        return {"global_step": step, **self.last_train, **self.last_eval}

    def _stop_if_requested(self, step: int) -> None:
        if not self.stop.requested:
            return
        self._clear_progress()
        if step > self.start_step:
            path = self._save(step)
            what = f"checkpoint {path} saved"
        else:
            what = "no step trained since the start, nothing to save"
        raise stop_lib.StopRequested(
            f"stopped by {self.stop.describe()} at step {step}; {what}",
            self.stop.signum,
            step,
            signalled_while_training=(self.stop.first_at or 0.0) >= self.training_since,
        )

    def _save(self, step: int) -> str:
        self.before_save(step)
        try:
            path = self.checkpointer.save()
        except (tf.errors.ResourceExhaustedError, OSError) as e:
            if "No space left" not in str(e) and getattr(e, "errno", None) != errno.ENOSPC:
                raise
            latest = self.checkpointer.latest_checkpoint
            raise stop_lib.NoSpace(
                f"no space left on device saving the checkpoint of step {step} in {self.config.model_dir}; "
                f"the last whole checkpoint is {latest or 'none'}. Free space and rerun the same command to resume."
            ) from e
        self.on_checkpoint(step)
        return path

    def _step(self) -> int:
        return int(self.updater.global_step.numpy())

    def _train_window(self, step: int, n: int) -> int:
        """Runs up to `n` steps (fewer when a stop is requested); returns how many ran. A cut window's
        metrics are not written: the run checkpoints and stops next."""
        want_histograms = is_time(step + n, self.config.histogram_every_steps)
        if self.progress is not None:
            self.progress.window_started(step)
        start = time.perf_counter()
        with self.stall.window(judged=self._windows > 0) if self.stall else contextlib.nullcontext():
            result = self.updater.train_steps(n, want_gradients=want_histograms, should_stop=self._after_step)
        ran = result.steps
        seconds = time.perf_counter() - start
        self._windows += 1
        if ran == 0:
            return 0
        counted = self.throughput.add(ran, seconds, result.traced_steps, result.traced_sec, self.examples_per_step)
        if ran < n:
            return ran
        self.interval.add(n, result.scalars(), seconds, counted)
        if self.progress is not None:
            self.progress.note = self._slow_live(result.tower_step_sec) or ""
        if result.staleness:
            self.interval.staleness.extend(result.staleness)
            self.summaries.staleness(step + n, result.staleness)
        if result.gradients is not None:
            self.summaries.histograms(step + n, self.histogram_tags, result.gradients, self.histogram_variables)
        return n

    def _after_step(self) -> bool:
        """Called by the mode after every step: redraws the live line (at most once a second), and says
        whether to stop."""
        if self.progress is not None:
            self.progress.tick()
        return self.stop.requested

    def _events(self, step: int) -> None:
        c = self.config
        if is_time(step, c.log_every_steps) or step in (c.train_steps, self.start_step + 1):
            self._log_train(step)
        if is_time(step, c.checkpoint_every_steps):
            self._save(step)  # before the eval: a save never waits behind one
        if is_time(step, c.eval_every_steps):
            self._evaluate(step)
        self._profile(step)

    def _profile(self, step: int) -> None:
        """Starts the TensorFlow profiler after step A and stops it after step B (`--profile_steps=A,B`); the
        trace lands in model_dir/train/plugins/profile, TensorBoard's Profile tab."""
        if self.config.profile_steps is None:
            return
        first, last = self.config.profile_steps
        if step == first:
            tf.profiler.experimental.start(os.path.join(self.config.model_dir, "train"))
        elif step == last:
            tf.profiler.experimental.stop()
            self.log(f"profiler trace of steps {first + 1}..{last} written to {self.config.model_dir}/train")

    def _log_train(self, step: int) -> None:
        """Writes the train scalars of the steps since the previous log line, and one console line."""
        scalars = {**self.interval.scalars(), **self.extra_scalars()}
        self.summaries.scalars("train", step, scalars)
        reported = ("loss", *self.interval.metrics)  # the task's figures: train_loss, train_accuracy, ...
        self.last_train = {("train_" + k if k in reported else k): v for k, v in scalars.items()}
        rate = scalars.get("examples_per_sec")
        if rate is None:  # the first step of a start: its time is mostly graph tracing
            speed = f"first step {self.interval.seconds:.1f} s (includes graph tracing)"
        else:
            eta = (self.config.train_steps - step) * self.examples_per_step / rate
            speed = f"{rate:,.0f} ex/s  eta {progress_lib.format_duration(eta)}"
            slow = self._slow_logged(scalars["tower_step_sec"])
            speed += f"  ({slow})" if slow else ""
        figures = "".join(f"  {name} {_figure(scalars[name])}" for name in self.interval.metrics)
        self.interval.reset()
        self._clear_progress()
        self.log(
            f"step {step:>7d}/{self.config.train_steps}  loss {scalars['loss']:.4f}{figures}  "
            f"lr {scalars['learning_rate']:.3g}  {speed}"
        )

    def _evaluate(self, step: int, final: bool = False) -> None:
        """Evaluates, showing how far it is (`data.phase`: a live line on a terminal, a line a minute in a log).
        An eval during training gives way to a stop request (and the loop then stops); the final one, after the
        final checkpoint, runs to the end: the run is finished and will not rerun."""
        if self.evaluator is None:
            return
        expected = getattr(self.evaluator, "num_examples", None)  # the eval records counted before training
        with Phase(f"eval at step {step}", expected, "examples", live=self.progress is not None) as phase:
            values = self.evaluator.evaluate(None if final else lambda: self.stop.requested, phase.update)
        if values is None:
            self._stop_if_requested(step)
        self._clear_progress()
        figures = {k[len("eval_") :]: v for k, v in values.items() if k != "eval_examples"}
        self.summaries.scalars("eval", step, {k: v for k, v in figures.items() if v is not None})
        self.last_eval = {**values, "step": step}
        shown = "  ".join(f"{name} {_figure(value)}" for name, value in figures.items())
        self.log(f"eval at step {step}: {shown}  ({values['eval_examples']} examples)")

    def _clear_progress(self) -> None:
        if self.progress is not None:
            self.progress.clear()


def _figure(value) -> str:
    """A metric as the log lines show it: 4 decimals, or n/a when nothing was counted."""
    return "n/a" if value is None else f"{value:.4f}"
