"""The soak's memory verdict (bench/soak.py): the first and the last minute after warm-up,
medians, against the stated bound; a reload's brief second session is not growth."""

from __future__ import annotations

from collections import Counter

import pytest

from textserve.bench.soak import (
    GROWTH_MB,
    KILL_GRACE,
    MESSAGES,
    WARMUP,
    of_the_killed_worker,
    rss_growth,
    tally,
)


def series(seconds: int, rss: float, slope_per_minute: float = 0.0) -> list[tuple[float, float]]:
    """One sample a second; every 60 s a reload: 3 s with a second session (+10 MiB)."""
    return [
        (float(t), rss + slope_per_minute * t / 60 + (10.0 if t % 60 < 3 else 0.0))
        for t in range(seconds)
    ]


def test_a_flat_process_with_reload_spikes_is_flat() -> None:
    judged = rss_growth(series(480, 110.0))
    assert judged is not None and judged["flat"]
    assert judged["growth_mb"] == pytest.approx(0.0) and judged["start_mb"] == 110.0


def test_a_process_that_grows_beyond_the_bound_is_not_flat() -> None:
    # 2 MiB a minute: ~11 MiB between the first and last minute after warm-up of 8 minutes
    judged = rss_growth(series(480, 110.0, slope_per_minute=2.0))
    assert judged is not None and not judged["flat"]
    assert judged["growth_mb"] > judged["bound_mb"] == GROWTH_MB
    # the same growth spread over a long soak's larger process is within 5 % of it
    assert rss_growth(series(480, 400.0, slope_per_minute=2.0))["flat"]  # type: ignore[index]


def test_a_process_too_short_lived_is_not_judged() -> None:
    assert rss_growth(series(int(WARMUP) + 100, 110.0)) is None
    assert rss_growth([]) is None
    # a replacement worker is judged from its own first sample, not the soak's start
    late = [(t + 240.0, v) for t, v in series(240, 100.0)]
    assert rss_growth(late) is not None


def test_every_failure_message_is_counted_up_to_a_bound() -> None:
    messages: Counter[str] = Counter()
    for _ in range(3):
        tally(messages, "RESOURCE_EXHAUSTED", "calls waited longer than 100 ms")
    tally(messages, "UNAVAILABLE", "x" * 1000)
    assert messages["RESOURCE_EXHAUSTED: calls waited longer than 100 ms"] == 3
    assert messages[f"UNAVAILABLE: {'x' * 200}"] == 1  # cut to 200 characters
    for i in range(2 * MESSAGES):
        tally(messages, "INTERNAL", f"distinct {i}")
    assert len(messages) == MESSAGES + 1  # the bound, and "(other)" for the rest
    assert messages["(other)"] == 2 * MESSAGES - (MESSAGES - 2)
    assert sum(messages.values()) == 4 + 2 * MESSAGES


def test_only_unavailable_near_the_kill_is_the_killed_workers() -> None:
    t0, kill_at = 100.0, 60.0  # the kill at 160 s on the monotonic clock
    failures = [
        (159.0, "UNAVAILABLE"),  # before the kill: not its
        (160.5, "UNAVAILABLE"),  # a call in flight on it
        (161.0, "stream UNAVAILABLE"),  # the stream it held
        (162.0, "RESOURCE_EXHAUSTED"),  # a survivor refusing the load it was handed
        (163.0, "INTERNAL"),
        (166.0, "UNAVAILABLE"),  # past KILL_GRACE
    ]
    assert KILL_GRACE == 5.0
    assert of_the_killed_worker(failures, t0, kill_at) == ["UNAVAILABLE", "stream UNAVAILABLE"]
    assert of_the_killed_worker(failures, t0, None) == []  # no kill: nobody's


def test_a_long_soak_prints_a_line_a_minute() -> None:
    from types import SimpleNamespace

    from textserve.bench.soak import progress

    load = SimpleNamespace(codes={"OK": 123456}, failures=[(1.0, "UNAVAILABLE")] * 3)
    processes = {"11": {"rss_mb": 78.12}, "12": {"rss_mb": 137.33}}
    line = progress(90.0, 30, load, processes)  # type: ignore[arg-type]
    assert line == " 1.5 / 30 min: 123,456 OK, 3 errors; RSS MiB 11 78.1, 12 137.3"
