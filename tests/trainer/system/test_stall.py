"""The chief's heartbeat of progress (trainer/system/stall.py) and the naming of a slow task
(trainer/outputs/progress.py), on counters and times made up here: no TensorFlow run."""

import threading
import time

import pytest

from trainer.outputs.progress import Stragglers, straggler
from trainer.system.stall import TRACE_ALLOWANCE, StallWatch


class Steps:
    """A step counter that a thread advances every `every` seconds until `freeze()`."""

    def __init__(self, every: float):
        self.count, self.every = 0, every
        self._frozen = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self._frozen.wait(self.every):
            self.count += 1

    def freeze(self):
        self._frozen.set()


def watch(steps, timeout_sec, silent=list):
    """A StallWatch whose end records the message and the time instead of exiting the process."""
    ended = []

    def end(message, on_lost):
        on_lost(message)
        ended.append((time.monotonic(), message))

    recorded = []
    what = "one of the tasks (task 0 a:1, task 1 b:1)"
    return StallWatch(lambda: steps.count, timeout_sec, what, recorded.append, silent, end, 0.05), ended, recorded


def test_steps_that_stop_finishing_end_the_attempt_after_the_timeout_naming_the_tasks():
    steps = Steps(every=0.02)
    stall, ended, recorded = watch(steps, timeout_sec=0.6)
    with stall, stall.window():
        time.sleep(0.5)
        assert not ended and steps.count > 10
        steps.freeze()
        frozen = time.monotonic()
        time.sleep(1.2)
    assert len(ended) == 1 and recorded == [ended[0][1]]
    assert 0.6 <= ended[0][0] - frozen < 0.6 + 0.3
    assert ended[0][1].startswith("no training step finished for 1 s (the limit: --peer_timeout_sec=0.6, or ")
    assert (
        "though every task's server answers: a device of one of the tasks (task 0 a:1, task 1 b:1) is stuck"
        in (ended[0][1])
    )


def test_the_first_window_is_measured_not_judged_and_sets_the_limit_for_later_tracing():
    steps = Steps(every=0.8)  # the first step: tracing
    stall, ended, _ = watch(steps, timeout_sec=0.3)
    with stall:
        with stall.window(judged=False):
            while steps.count == 0:
                time.sleep(0.01)
        assert not ended and 0.7 < stall.longest_wait < 1.0
        assert stall.limit_sec == TRACE_ALLOWANCE * stall.longest_wait
        steps.freeze()
        with stall.window():  # a later graph's tracing, within TRACE_ALLOWANCE x the first step
            time.sleep(1.5)
        assert not ended
        with stall.window():
            time.sleep(stall.limit_sec + 0.3)
        assert len(ended) == 1


def test_nothing_is_judged_between_windows():
    """Evaluation and checkpoints run between windows: no step finishes there, and none has to."""
    steps = Steps(every=0.02)
    stall, ended, _ = watch(steps, timeout_sec=0.2)
    with stall:
        with stall.window():
            time.sleep(0.2)
        steps.freeze()
        time.sleep(0.8)
    assert not ended


def test_a_stall_while_a_peer_is_silent_is_left_to_the_peer_watch_which_names_it():
    """A frozen worker stalls the steps and stops answering: the peer watch ends the attempt naming it; the
    stall watch must not end it first blaming every task."""
    steps, silent = Steps(every=0.02), [1]
    stall, ended, _ = watch(steps, timeout_sec=0.3, silent=lambda: silent)
    with stall, stall.window():
        time.sleep(0.2)
        steps.freeze()
        time.sleep(0.8)
        assert not ended
        silent.clear()  # it answers again, and still no step finishes: a device is stuck
        time.sleep(0.3)
    assert len(ended) == 1


@pytest.mark.parametrize(
    "tower_sec, num_tasks, named",
    [
        ([0.1, 0.1, 0.1, 0.1], 2, None),
        ([0.1, 0.12, 0.3, 0.1], 2, "task 1 is slow: 0.3 s a step, the other tasks 0.12 s"),  # a task's slowest tower
        ([0.1, 0.14, 0.1], 3, None),  # 1.4 x: within the margin
        ([0.1, 0.1, 0.45, 0.11], 4, "task 2 is slow: 0.45 s a step, the other tasks 0.1 s"),
        ([0.1, 0.9], 1, None),  # one task: towers of one machine are not named here
        ([], 2, None),  # no times (the window was cut)
    ],
)
def test_a_task_slower_than_the_others_by_the_margin_is_named(tower_sec, num_tasks, named):
    found = straggler(tower_sec, num_tasks)
    assert (found and found[1]) == named


def test_a_task_is_named_only_when_it_was_the_slow_one_at_the_previous_look_too():
    """One look crossing the ratio is chance on tiny steps beside a busy neighbour (seen: task 0 named once at
    0.0074 against 0.0041 s in a loaded suite run); a slow node stays slow."""
    watch = Stragglers(2)
    slow0, slow1, even = [0.3, 0.1], [0.1, 0.3], [0.1, 0.1]
    named = [watch(t) for t in (slow1, slow1, slow0, slow1, even, slow1, slow1, slow1, [])]
    one = "task 1 is slow: 0.3 s a step, the other tasks 0.1 s"
    assert named == [None, one, None, None, None, None, one, one, None]
    assert [watch(t) for t in (slow0, slow0)] == [None, "task 0 is slow: 0.3 s a step, the other tasks 0.1 s"]
    assert Stragglers(1)([0.1, 0.9]) is None
