"""What the console shows while training: the train scalars' one definition, and a live progress line.

The loop runs steps in windows cut by every cadence (log, eval, checkpoint, histograms, profiler). A logged
value must not depend on how the other cadences cut the steps, so `LogInterval` gathers every window between
two log lines and each logged value is over exactly those steps:

- `loss`, the task's metrics (`accuracy`, ...), `grad_global_norm`: means over the steps (each window
  weighted by its steps);
- `examples_per_sec`: their examples over their seconds, by the one rule of `Throughput` (below), which the
  run's figure and `attempts.json` follow too;
- `learning_rate`: the value at the logged step;
- async `staleness_mean`, `staleness_max`: over every update of the steps;
- `tower_step_sec/<tower>`: each tower's time on its micro-batches of one step, averaged over the windows
  (sync mode times the last step of each window, as timing every step costs a host callback per tower;
  async times every update). With several tasks, a task whose slowest tower takes `STRAGGLER_RATIO` times
  the others' (their median) at two looks running is named on the log line and the live line (`Stragglers`).
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time

from data.phase import format_duration, is_terminal  # noqa: F401 (format_duration: this module's name too)


@dataclasses.dataclass
class Rate:
    """Examples over seconds."""

    examples: int = 0
    seconds: float = 0.0

    def add(self, other: Rate) -> None:
        self.examples += other.examples
        self.seconds += other.seconds

    @property
    def examples_per_sec(self) -> float | None:
        """None when nothing was counted."""
        return self.examples / self.seconds if self.seconds > 0 and self.examples else None


class Throughput:
    """Examples/sec of training, by one rule: a window's steps that traced a graph are left out (the update
    mode times them apart), and so is the first window of every start (one step, which also holds what the
    mode cannot time: the async towers' tracing, the first run of each graph). `add` every window of a start,
    in order; a start whose only window is its first reports that window (`totals`) rather than nothing."""

    def __init__(self):
        self.counted = Rate()
        self.warm_up: Rate | None = None  # the start's first window

    def add(self, steps: int, seconds: float, traced_steps: int, traced_sec: float, examples_per_step: int) -> Rate:
        """Adds a window of `steps` steps in `seconds`; returns what of it counts (nothing for the first)."""
        window = Rate((steps - traced_steps) * examples_per_step, seconds - traced_sec)
        if self.warm_up is None:
            self.warm_up = window
            return Rate()
        self.counted.add(window)
        return window

    def totals(self) -> tuple[int, float]:
        """(examples, seconds) of the counted windows, or of the first when it is the only one."""
        rate = self.counted if self.counted.seconds else (self.warm_up or Rate())
        return rate.examples, rate.seconds


@dataclasses.dataclass
class LogInterval:
    """The steps since the previous log line; `add` every window, `scalars` at the log line, then `reset`."""

    steps: int = 0
    seconds: float = 0.0  # wall time of the windows
    loss: float = 0.0  # sums, weighted by steps
    metrics: dict = dataclasses.field(default_factory=dict)  # the task's: name -> [sum weighted by steps, steps]
    grad_norm: float = 0.0
    learning_rate: float = 0.0
    rate: Rate = dataclasses.field(default_factory=Rate)  # what `Throughput.add` counted of the windows
    tower_sec: list = dataclasses.field(default_factory=list)  # one list of per-tower times per window
    staleness: list = dataclasses.field(default_factory=list)  # async: of every update

    def add(self, steps: int, values: dict, seconds: float, counted: Rate) -> None:
        self.steps += steps
        self.seconds += seconds
        self.loss += values["loss"] * steps
        for name, value in values["metrics"].items():
            total = self.metrics.setdefault(name, [0.0, 0])
            if value is not None:  # None: nothing was counted (a window of padding)
                total[0], total[1] = total[0] + value * steps, total[1] + steps
        self.grad_norm += values["grad_norm"] * steps
        self.learning_rate = values["learning_rate"]
        self.rate.add(counted)
        if values.get("tower_step_sec"):
            self.tower_sec.append(values["tower_step_sec"])

    @property
    def examples_per_sec(self) -> float | None:
        """None when no step of the interval counts (the first log line of a start)."""
        return self.rate.examples_per_sec

    def scalars(self) -> dict:
        """The train scalars of the interval, by TensorBoard tag (`tower_step_sec` a per-tower list)."""
        values = {
            "loss": self.loss / self.steps,
            **{name: total / steps if steps else None for name, (total, steps) in self.metrics.items()},
            "learning_rate": self.learning_rate,
            "grad_global_norm": self.grad_norm / self.steps,
            "tower_step_sec": [sum(t) / len(self.tower_sec) for t in zip(*self.tower_sec, strict=True)],
        }
        if self.examples_per_sec is not None:
            values["examples_per_sec"] = self.examples_per_sec
        if self.staleness:
            values.update(staleness_mean=sum(self.staleness) / len(self.staleness), staleness_max=max(self.staleness))
        return values

    def reset(self) -> None:
        self.__init__()


STRAGGLER_RATIO = 1.5


def straggler(tower_sec: list[float], num_tasks: int) -> tuple[int, str] | None:
    """(task, what to print) of the task whose step takes `STRAGGLER_RATIO` times the other tasks' or more (a
    task's time: its slowest tower's; the others': their median), from one time per tower (task-major); None
    when none is. One look: `Stragglers` names a task from two."""
    if num_tasks < 2 or len(tower_sec) < num_tasks:
        return None
    per_task = len(tower_sec) // num_tasks
    task_sec = [max(tower_sec[t * per_task : (t + 1) * per_task]) for t in range(num_tasks)]
    slowest = max(range(num_tasks), key=task_sec.__getitem__)
    others = sorted(sec for task, sec in enumerate(task_sec) if task != slowest)
    typical = others[len(others) // 2]
    if typical <= 0 or task_sec[slowest] < STRAGGLER_RATIO * typical:
        return None
    return slowest, f"task {slowest} is slow: {task_sec[slowest]:.3g} s a step, the other tasks {typical:.3g} s"


class Stragglers:
    """`straggler` at successive looks, naming a task only when it was the slow one at the previous look too:
    one look's times (sync times the last step of a window) cross the ratio by chance on tiny steps beside a
    busy neighbour; a slow node stays slow."""

    def __init__(self, num_tasks: int):
        self.num_tasks = num_tasks
        self._previous = None

    def __call__(self, tower_sec: list[float]) -> str | None:
        found = straggler(tower_sec, self.num_tasks)
        previous, self._previous = self._previous, None if found is None else found[0]
        return found[1] if found and found[0] == previous else None


class ProgressLine:
    """A live line on a terminal (step, loss, examples/s, ETA), redrawn at most once a second.

    `tick()` is cheap enough to call after every step: it reads the clock and, once a second, the global
    step and the latest loss (one small device read). Only the main thread draws (async towers poll too).

    Args:
      stream: where to draw (a terminal; benchmarks pass /dev/null to measure the cost).
      total_steps: the step budget.
      examples_per_step: examples of one global step.
      global_step: `tf.Variable` read at each redraw.
      latest_loss: returns the latest step's loss (a tensor or float) or None.
    """

    def __init__(self, stream, total_steps: int, examples_per_step: int, global_step, latest_loss):
        self.stream = stream
        self.total_steps = total_steps
        self.examples_per_step = examples_per_step
        self.global_step = global_step
        self.latest_loss = latest_loss
        self.shown = False
        self.note = ""  # shown at the end of the line (a slow task)
        self._base = (0, time.monotonic())
        self._next_draw = 0.0

    def window_started(self, step: int) -> None:
        """Rates count from here: the time between windows (eval, checkpoints) is not training."""
        self._base = (step, time.monotonic())

    def tick(self) -> None:
        now = time.monotonic()
        if now < self._next_draw or threading.current_thread() is not threading.main_thread():
            return
        self._next_draw = now + 1.0
        step = int(self.global_step.numpy())
        base_step, base_time = self._base
        if step <= base_step:
            return
        rate = (step - base_step) / (now - base_time)
        loss = self.latest_loss()
        loss_text = f"  loss {float(loss):.4f}" if loss is not None else ""
        eta = format_duration((self.total_steps - step) / rate)
        self.stream.write(
            f"\r\033[Kstep {step:>7d}/{self.total_steps}{loss_text}  "
            f"{rate * self.examples_per_step:,.0f} ex/s  eta {eta}{'  ' + self.note if self.note else ''}"
        )
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        """Erases the line, so that a log line replaces it."""
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False


def live_progress(stream=None) -> bool:
    """Whether to draw a live line: only on a terminal (a log file gets plain log lines)."""
    return is_terminal(stream or sys.stdout)
