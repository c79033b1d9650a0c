"""Admission by time (engine/admission.py): the drain rate, the wait ahead, the refusals."""

from __future__ import annotations

import pytest

from textserve.service.engine.admission import DRAIN_SMOOTHING, Admission, QueueWaitError
from textserve.service.errors import DeadlineExceededError, OverloadedError


def test_nothing_is_refused_before_the_first_batch_or_with_the_bound_off() -> None:
    admission = Admission(0.1)
    assert admission.expected_wait(10**9) == 0.0  # no rate measured yet: no guess
    admission.check(10**9, deadline=0.001, now=0.0)
    off = Admission(None)
    off.drained(100, 1.0)
    off.check(10**9, deadline=0.0, now=1.0)  # off: not even the deadline is judged here


def test_the_drain_rate_is_a_moving_average_and_the_wait_divides_by_workers() -> None:
    admission = Admission(1.0, workers=2)
    admission.drained(1000, 0.1)  # 10,000 tokens/s
    assert admission.rate == pytest.approx(10_000)
    admission.drained(1000, 0.05)  # 20,000 tokens/s pulls the average a tenth of the way
    assert admission.rate == pytest.approx(10_000 + DRAIN_SMOOTHING * 10_000)
    admission.drained(0, 0.1)  # an empty or instant batch says nothing about the rate
    admission.drained(10, 0.0)
    assert admission.rate == pytest.approx(11_000)
    assert admission.expected_wait(22_000) == pytest.approx(1.0)  # two workers drain it
    assert admission.expected_wait(0) == 0.0


def test_a_wait_over_the_bound_is_refused_as_overloaded_naming_the_wait() -> None:
    admission = Admission(0.25, name="m")
    admission.drained(10_000, 1.0)
    admission.check(2_500, deadline=None, now=0.0)  # exactly the bound: accepted
    with pytest.raises(QueueWaitError) as refused:
        admission.check(2_600, deadline=None, now=0.0)
    assert isinstance(refused.value, OverloadedError) and refused.value.reason == "queue_wait"
    assert "260 ms of work (limit 250 ms)" in str(refused.value)


def test_a_deadline_nearer_than_the_wait_is_refused_up_front() -> None:
    admission = Admission(1.0, name="m")
    admission.drained(10_000, 1.0)
    admission.check(1_000, deadline=10.2, now=10.0)  # 100 ms of work, 200 ms left
    with pytest.raises(DeadlineExceededError, match="100 ms of work, more than the 50 ms left"):
        admission.check(1_000, deadline=10.05, now=10.0)
