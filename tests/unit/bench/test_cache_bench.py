"""The cache benchmark's workload and its reading of the server's counters (no server)."""

from __future__ import annotations

from collections import Counter

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from textserve.bench import cache as bench_cache
from textserve.service.metrics import Metrics


def test_zipf_texts_repeat_a_few_texts_often_and_most_rarely() -> None:
    texts = [f"text {i}" for i in range(1000)]
    drawn = bench_cache.zipf_texts(texts, 50_000, 1.1, seed=3)
    assert drawn == bench_cache.zipf_texts(texts, 50_000, 1.1, seed=3)  # one sequence per seed
    counts = sorted(Counter(drawn).values(), reverse=True)
    assert set(drawn) <= set(texts) and len(drawn) == 50_000
    # rank 1 vs rank 10 of a Zipf law of s = 1.1: 10**1.1 ~ 12.6 times as often
    assert 8 < counts[0] / counts[9] < 20
    assert len(counts) > 900  # the tail is drawn too


def test_cache_counts_reads_hits_and_misses_of_every_model(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.for_cache("a").on_lookups(hits=5, misses=2)
    metrics.for_cache("b").on_lookups(hits=1, misses=0)
    page = generate_latest(metrics.registry).decode()
    monkeypatch.setattr(bench_cache, "fetch", lambda url: page)
    assert bench_cache.cache_counts("http://x/metrics") == (6.0, 2.0)


def test_the_report_takes_the_median_of_the_rounds() -> None:
    def step(texts_per_s: float, p99: float, rate: float | None) -> dict[str, object]:
        latency = {"p50": p99 / 4, "p99": p99}
        return {"throughput_texts_per_s": texts_per_s, "latency_ms": latency,
                "cache_hit_rate": rate, "errors": {}}  # fmt: skip

    rounds = [{"on": step(t, p, r)} for t, p, r in ((100, 9, 0.9), (300, 3, 0.8), (200, 5, 0.7))]
    median = bench_cache._median(rounds, "on")
    assert median["throughput_texts_per_s"] == 200 and median["latency_ms"]["p99"] == 5
    assert median["cache_hit_rate"] == 0.8 and median["errors"] == 0
