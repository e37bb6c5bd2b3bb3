"""What every update mode's stepper offers the loop: `Updater`, and the `StepResult` of a window of steps.

No TensorFlow import here: `trainer.step.modes` (read before TensorFlow is imported) names these types.
"""

from __future__ import annotations

import abc
import dataclasses


@dataclasses.dataclass
class StepResult:
    """The outcome of `Updater.train_steps(n)`, the same types in every mode (host values, read once per window).

    `steps`: how many ran (fewer than n: cut by a stop request, and then only `steps`, `traced_steps` and
    `traced_sec` are set: the run checkpoints and ends, nothing is logged). `traced_steps`, `traced_sec`:
    steps that traced a graph, and their wall time (rates leave them out). The loss and the task's `metrics`
    are over the steps (each metric its sum over its count);
    `learning_rate` is the last step's, `tower_step_sec` each tower's seconds on one step. `staleness`: of
    every update, in step order (empty in modes without staleness). `gradients`: the last update's gradient,
    one tensor per trainable variable, when asked (for histograms), else None.
    """

    steps: int
    traced_steps: int = 0
    traced_sec: float = 0.0
    loss: float | None = None
    metrics: dict = dataclasses.field(default_factory=dict)  # the task's, each sum / count over the steps
    grad_norm: float | None = None
    learning_rate: float | None = None
    tower_step_sec: list[float] = dataclasses.field(default_factory=list)
    staleness: list[int] = dataclasses.field(default_factory=list)
    gradients: list | None = None

    def scalars(self) -> dict:
        """The values a log line is made of (`trainer.outputs.progress.LogInterval.add`)."""
        return {
            "loss": self.loss,
            "metrics": self.metrics,
            "grad_norm": self.grad_norm,
            "learning_rate": self.learning_rate,
            "tower_step_sec": self.tower_step_sec,
        }


class Updater(abc.ABC):
    """Runs the steps of one update mode (built by `trainer.step.modes.UpdateMode.build`).

    Attributes:
      global_step: int64 `tf.Variable`; +1 per update.
      examples_per_step: examples of one update.
    """

    global_step: object
    examples_per_step: int

    @abc.abstractmethod
    def train_steps(self, num_steps: int, want_gradients: bool = False, should_stop=None) -> StepResult:
        """Runs up to `num_steps` updates, fewer when `should_stop()` (asked after every step) turns true."""

    @abc.abstractmethod
    def interrupt(self) -> None:
        """Ends the call in progress after its current step; thread-safe (called from a signal watcher)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Releases what the mode holds (threads); the updater is not used after."""

    @property
    @abc.abstractmethod
    def steps_finished(self) -> int:
        """Updates this process has finished since it started: a host counter, cheap to read from any thread
        (the chief's stall watch, `trainer.system.stall`, reads it to tell progress from a hang)."""

    @property
    @abc.abstractmethod
    def latest_loss(self) -> float | None:
        """The loss of the latest update, None before the first; read by the live progress line (once a second)."""

    def wrap_micro_batch(self, wrap) -> None:
        """Replaces the function every tower runs per micro-batch with `wrap(it)`; call before the first step
        traces. The function is `trainer.step.core.micro_batch.micro_batch_fn`'s: (trainable values, non-trainable
        values, batch, loss scale) -> `MicroBatchResult`, called under the tower's device scope.
        A seam for measurements (`benchmarks/slow_tower.py` slows one tower), not used in training, so a mode
        need not offer it (both built-in modes do).

        Raises:
          NotImplementedError: the mode has no such function.
        """
        raise NotImplementedError(f"{type(self).__name__} has no micro-batch function to wrap")

    @property
    def staleness_all(self) -> list[int]:
        """The staleness of every update of this process (a resumed run counts from its restart); empty in
        modes where every update reads the variables of the step before."""
        return []
