"""Examples/sec by one rule (`trainer.outputs.progress.Throughput`): what the log lines, the run's figure and
attempts.json count."""

import pytest

from trainer.outputs import attempts, progress


@pytest.mark.quick
def test_the_first_window_and_traced_steps_are_left_out():
    throughput = progress.Throughput()
    # window 1: 1 step of 100 examples in 2 s (graph tracing): warm-up, not counted
    assert throughput.add(1, 2.0, traced_steps=1, traced_sec=1.5, examples_per_step=100) == progress.Rate()
    # window 2: 10 steps in 1.5 s, of which 2 traced a graph in 0.5 s: 8 steps in 1 s count
    assert throughput.add(10, 1.5, traced_steps=2, traced_sec=0.5, examples_per_step=100) == progress.Rate(800, 1.0)
    assert throughput.add(4, 1.0, traced_steps=0, traced_sec=0.0, examples_per_step=100) == progress.Rate(400, 1.0)
    assert throughput.totals() == (1200, 2.0)


def test_a_start_of_one_window_reports_that_window():
    throughput = progress.Throughput()
    throughput.add(5, 2.0, traced_steps=1, traced_sec=1.0, examples_per_step=10)
    assert throughput.totals() == (40, 1.0)
    assert progress.Throughput().totals() == (0, 0.0)


def test_a_log_interval_rates_only_what_the_throughput_counted():
    throughput, interval = progress.Throughput(), progress.LogInterval()
    values = {"loss": 1.0, "metrics": {"accuracy": 0.5}, "grad_norm": 2.0, "learning_rate": 0.1}
    interval.add(1, values, 3.0, throughput.add(1, 3.0, 1, 2.5, 64))
    assert interval.examples_per_sec is None and "examples_per_sec" not in interval.scalars()  # warm-up only
    interval.reset()
    for _ in range(2):
        interval.add(4, values, 1.0, throughput.add(4, 1.0, 0, 0.0, 64))
    assert interval.examples_per_sec == pytest.approx(256.0) == interval.scalars()["examples_per_sec"]


def test_an_attempt_and_the_run_divide_the_counted_examples_by_seconds():
    one = attempts.Attempt(1, "t", "h", 1, 0, examples=1000, train_sec=4.0)
    assert one.examples_per_sec == 250.0
    assert attempts.Attempt(2, "t", "h", 1, 0).examples_per_sec == 0.0  # nothing timed yet
