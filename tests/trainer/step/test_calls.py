"""How many steps a sync call runs: fixed, auto from the measured step time, one per profiled step."""

import pytest

from trainer.step.core import calls
from trainer.step.core.calls import CallSize


def test_fixed_size_is_capped_by_the_window():
    size = CallSize(steps_per_call=8)
    assert [size.size(0, remaining) for remaining in (100, 8, 3, 1)] == [8, 8, 3, 1]


def test_auto_follows_the_measured_step_time():
    size = CallSize()
    assert size.size(0, 1000) == calls.FIRST_AUTO_STEPS
    size.ran(4, 0.08)  # 20 ms steps: 25 fit in half a second
    assert size.size(4, 1000) == 25
    assert size.size(4, 10) == 10
    size.ran(2, 3.0)  # 1.5 s steps: one per call
    assert size.size(6, 1000) == 1
    size.ran(100, 1e-4)  # 1 us steps: capped
    assert size.size(106, 10**6) == calls.MAX_AUTO_STEPS


def test_profiled_steps_run_one_per_call():
    size = CallSize(steps_per_call=50, profile_steps=(3, 7))
    assert [size.size(step, 100) for step in (0, 2, 3, 6, 7)] == [3, 1, 1, 1, 50]


def test_negative_is_refused():
    with pytest.raises(ValueError, match=r"steps_per_call \(-1\) must be at least 0"):
        CallSize(steps_per_call=-1)
