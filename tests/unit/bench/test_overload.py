"""bench/overload.py's verdict on one row: the promises of issue 39's open-loop acceptance."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from textserve.bench.overload import REFUSALS, plot_rows, table, verdict
from textserve.bench.timeline import per_second

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


def test_the_timeline_puts_each_arrival_in_its_second() -> None:
    outcomes = [
        (0.1, 0.010, None), (0.5, 0.030, None), (0.9, 0.002, "RESOURCE_EXHAUSTED"),
        (1.2, 0.400, None), (1.3, 0.001, "HTTP_429"), (1.4, 9.0, "TIMEOUT"),
        (2.9999, 0.050, None),
    ]  # fmt: skip
    rows = per_second(outcomes, 3.0, REFUSALS)
    assert [r["t"] for r in rows] == [0, 1, 2]
    assert [(r["arrivals"], r["ok"], r["refused"], r["other"]) for r in rows] == [
        (3, 2, 1, 0), (3, 1, 1, 1), (1, 1, 0, 0),
    ]  # fmt: skip
    assert rows[0]["accepted_p50_ms"] == 10.0 and rows[0]["accepted_p99_ms"] == 30.0
    assert rows[0]["refused_p99_ms"] == 2.0 and rows[2]["refused_p99_ms"] is None
    assert rows[1]["accepted_p99_ms"] == 400.0  # the slow second shows where it happened


def test_the_plot_draws_each_row(tmp_path: Path) -> None:
    judged = verdict(row({"RESOURCE_EXHAUSTED": 1}), ARGS)
    judged["timeline"] = per_second([(0.2, 0.1, None), (1.5, 0.003, "HTTP_429")], 2, REFUSALS)
    plot_rows([judged, judged], ARGS, tmp_path / "overload.png")
    assert (tmp_path / "overload.png").read_bytes().startswith(b"\x89PNG")


def test_the_http_pool_grows_with_the_workers_unless_asked() -> None:
    from textserve.bench.loadgen import HTTP_POOL, http_pool

    assert http_pool(None, 1) == HTTP_POOL and http_pool(None, 2) == 2 * HTTP_POOL
    assert http_pool(0, 2) == 0 and http_pool(300, 2) == 300
