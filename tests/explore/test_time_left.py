"""The time-left estimate added to progress messages."""

from __future__ import annotations

import pytest

from sparsefinder.explore import time_left


@pytest.mark.parametrize(("seconds", "text"), [
    (0.4, "0 s"), (42.4, "42 s"), (185, "3 min 05 s"), (3720, "1 h 02 min"), (-3, "0 s"),
])
def test_durations_read_in_the_units_of_a_wait(seconds, text):
    assert time_left.format_duration(seconds) == text


def test_the_estimate_is_the_rate_so_far():
    assert time_left.estimate(10.0, 0.25) == pytest.approx(30.0)
    assert time_left.estimate(10.0, 1.0) == 0.0


def test_no_estimate_before_enough_work_or_time():
    assert time_left.estimate(10.0, time_left.MIN_FRACTION / 2) is None
    assert time_left.estimate(time_left.MIN_SECONDS / 2, 0.5) is None


def test_messages_gain_the_time_left_once_it_can_be_told():
    now = [100.0]
    seen: list[tuple[float, str]] = []
    report = time_left.with_time_left(lambda f, m: seen.append((f, m)), clock=lambda: now[0])
    report(0.01, "1/100 texts")  # too early: no estimate
    now[0] += 20.0
    report(0.4, "40/100 texts")  # 20 s for 40 % → 30 s left
    report(1.0, "100/100 texts")  # done: nothing left to announce
    assert seen == [(0.01, "1/100 texts"), (0.4, "40/100 texts — about 30 s left"),
                    (1.0, "100/100 texts")]
