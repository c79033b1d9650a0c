"""The fast histogram observations write exactly what prometheus-client's observe writes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram

from textserve.service.histograms import SMALL, observe, observe_many
from textserve.service.metric_labels import LATENCY_BUCKETS


def _pair(buckets: tuple[float, ...]) -> tuple[CollectorRegistry, Histogram, Histogram]:
    registry = CollectorRegistry()
    reference = Histogram("reference", "by observe", ["m"], buckets=buckets, registry=registry)
    fast = Histogram("fast", "by textserve.service.histograms", ["m"], buckets=buckets,
                     registry=registry)  # fmt: skip
    return registry, reference, fast


def _samples(registry: CollectorRegistry, name: str) -> dict[str, float]:
    out = {}
    for family in registry.collect():
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name.endswith(("_bucket", "_count", "_sum")):
                key = sample.name.removeprefix(name) + sample.labels.get("le", "")
                out[key] = sample.value
    return out


# values on, just under and just over every bound, far beyond the last, zero and negatives
EDGES = [b + d for b in LATENCY_BUCKETS[:-1] for d in (-1e-9, 0.0, 1e-9)] + [0.0, -1.0, 1e6]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_observe_and_observe_many_equal_observe_value_for_value(seed: int) -> None:
    registry, reference, fast = _pair(LATENCY_BUCKETS)
    rng = np.random.default_rng(seed)
    values = [*EDGES, *rng.lognormal(-5, 3, 500).tolist()]
    rng.shuffle(values)
    for value in values:
        reference.labels("a").observe(value)
    # one by one, then in batches of every size around the small-batch path's threshold
    half = len(values) // 2
    for value in values[:half]:
        observe(fast.labels("a"), value)
    rest, sizes = values[half:], [1, 2, SMALL - 1, SMALL, SMALL + 1, 100]
    while rest:
        size = sizes[len(rest) % len(sizes)]
        chunk, rest = rest[:size], rest[size:]
        observe_many(fast.labels("a"), np.array(chunk) if len(chunk) % 2 else chunk)
    want, got = _samples(registry, "reference"), _samples(registry, "fast")
    assert want.keys() == got.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key


def test_nan_counts_in_the_sum_alone_as_observe_does() -> None:
    registry, reference, fast = _pair((0.1, 1.0, math.inf))
    reference.labels("a").observe(math.nan)
    observe(fast.labels("a"), math.nan)
    observe_many(fast.labels("a"), [math.nan])
    for name in ("reference", "fast"):
        buckets = _samples(registry, name)
        assert buckets["_count"] == 0  # no bucket took it
        assert math.isnan(buckets["_sum"])


def test_an_empty_batch_writes_nothing() -> None:
    registry, _, fast = _pair((0.1, 1.0, math.inf))
    observe_many(fast.labels("a"), [])
    assert _samples(registry, "fast")["_count"] == 0
