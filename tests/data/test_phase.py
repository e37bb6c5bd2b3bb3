"""A long phase on the console (`data.phase`): a live line on a terminal, a few whole lines in a log, on a clock
the test moves (no waiting)."""

import io

import pytest

from data import phase

pytestmark = pytest.mark.quick


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _batches(shown: phase.Phase, clock: Clock, seconds: float, per_batch_sec: float, examples: int) -> None:
    """A phase of `seconds` in batches of `examples`, polled after every batch as the drawing thread would."""
    done = shown.done
    while clock.now - 100.0 < seconds:
        clock.now += per_batch_sec
        done += examples
        shown.update(done)
        shown.poll()


def test_off_a_terminal_a_three_minute_eval_writes_three_lines_never_one_per_batch():
    out, clock = io.StringIO(), Clock()
    shown = phase.Phase("eval at step 20", 7788, "examples", stream=out, live=False, clock=clock)
    _batches(shown, clock, 9.5, 0.5, 20)
    assert out.getvalue() == ""  # a phase shorter than FIRST_LINE_SEC adds no line
    _batches(shown, clock, 180.0, 0.5, 20)  # 360 batches
    shown.end()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines  # at 10 s, 70 s, 130 s
    assert lines[0] == "eval at step 20: 400 of 7,788 examples (5%), 0:00:10 so far"
    assert lines[2].startswith("eval at step 20: 5,200 of 7,788 examples (67%), 0:02:10")
    assert "\r" not in out.getvalue()


def test_on_a_terminal_the_line_is_redrawn_at_most_once_a_second_and_erased_at_the_end():
    out, clock = io.StringIO(), Clock()
    shown = phase.Phase("writing subword records", 10.9, "MB", stream=out, live=True, clock=clock)
    shown.update(0.5, "120 records")
    shown.poll()
    assert out.getvalue() == ""  # not before a second
    _batches(shown, clock, 5.0, 0.25, 1)  # 20 polls in 5 s
    draws = out.getvalue().split("\r\033[K")[1:]
    assert len(draws) == 5 and draws[0] == "writing subword records: 4.5 of 10.9 MB (41%), 120 records, 0:00:01 so far"
    shown.end()
    assert out.getvalue().endswith("\r\033[K") and "\n" not in out.getvalue()  # erased: the result's line goes there


def test_work_that_counts_nothing_says_what_it_does_and_how_long():
    out, clock = io.StringIO(), Clock()
    shown = phase.Phase("exporting to export/20", detail="writing the SavedModel", stream=out, live=False, clock=clock)
    clock.now += 12
    shown.poll()
    assert out.getvalue() == "exporting to export/20: writing the SavedModel, 0:00:12 so far\n"


def test_the_thread_draws_while_the_work_reports_nothing_and_stops_with_the_phase():
    """One long call (an export) shows too: the phase's own thread polls; it has ended when `with` has."""
    out, clock = io.StringIO(), Clock()
    with phase.Phase("exporting to export/3", stream=out, live=False, clock=clock) as shown:
        clock.now += phase.FIRST_LINE_SEC
        while not out.getvalue():
            shown._ended.wait(0.01)  # the thread's next poll, an event
    assert out.getvalue() == "exporting to export/3: 0:00:10 so far\n"
    assert not shown._thread.is_alive()


def test_unshown_phases_show_nothing():
    with phase.shown("reading 3 files", None, total=1.0, unit="MB") as shown:
        shown.update(0.5)
    assert isinstance(shown, phase.Unshown)
