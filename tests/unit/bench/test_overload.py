"""bench/overload.py's verdict on one row: the promises of issue 39's open-loop acceptance."""

from __future__ import annotations

import argparse
from typing import Any

from textserve.bench.overload import table, verdict

ARGS = argparse.Namespace(p99_bound=3.0, refusal_bound_ms=50.0)


def row(errors: dict[str, int], p99: float = 200.0, refusal_p99: float = 5.0) -> dict[str, Any]:
    latency = {"p50": 50.0, "p99": p99}
    step = {
        "errors": errors,
        "error_latency_ms": {code: {"p50": 1.0, "p99": refusal_p99} for code in errors},
        "latency_ms": latency,
        "not_sent": 0,
        "throughput_requests_per_s": 900.0,
        "loadgen": {"cpu_share": 0.2},
    }
    closed = {"latency_ms": {"p50": 40.0, "p99": 100.0}, "throughput_requests_per_s": 1000.0}
    return {"workers": 1, "api": "v1", "rate": 1500.0, "closed": closed, "open": step}


def test_refusals_fast_and_a_bounded_tail_meet_it() -> None:
    judged = verdict(row({"RESOURCE_EXHAUSTED": 500, "HTTP_429": 3}), ARGS)
    assert judged["met"] and judged["p99_ratio"] == 2.0
    assert "| 1 | v1 | 1,000 |" in table([judged], "test machine")


def test_each_broken_promise_fails_it() -> None:
    assert not verdict(row({"CANCELLED": 1}), ARGS)["checks"]["no_cancelled_or_internal"]
    assert not verdict(row({"HTTP_CONNECTION": 4}), ARGS)["checks"]["every_arrival_answered"]
    assert not verdict(row({}, p99=301.0), ARGS)["checks"]["accepted_p99_within_bound"]
    slow = verdict(row({"RESOURCE_EXHAUSTED": 9}, refusal_p99=1200.0), ARGS)
    assert not slow["checks"]["refusals_fast"] and not slow["met"]
