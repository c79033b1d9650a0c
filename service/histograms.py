"""Histogram observations at the cost of one bucket search, and of a whole batch at once.

    observe(child, 0.0042)                       # == child.observe(0.0042), bisect not a scan
    observe_many(child, np.array(waits))          # == [child.observe(w) for w in waits]

prometheus-client's `Histogram.observe` walks its bucket bounds in Python until the value fits:
with the fine latency buckets (100 µs to 10 s, 30 bounds) a slow request costs ~30 comparisons,
and a batch of 64 texts 64 observations. Profiled at 256 callers on 2 cores, these
observations were 4 % of the event loop (docs/performance.md, "Where a request's time goes").
Both functions write the same cells as `observe` (the bucket's counter and the sum, the only
state a histogram child has, in memory or in multiprocess mode's files), so scrapes, multiprocess
aggregation and `get_sample_value` read the same numbers; tests/unit/service/test_histograms.py
holds them equal to `observe` value for value. Exemplars are not written: a caller with one uses
`child.observe(value, exemplar)`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

import numpy as np


def observe(child: Any, value: float) -> None:
    """`child.observe(value)` (a labelled Histogram child), found by bisection."""
    bounds = child._upper_bounds
    child._sum.inc(value)
    if value == value:  # NaN fits no bucket (observe counts it in the sum alone)
        child._buckets[bisect_left(bounds, value)].inc(1)  # the last bound is +Inf


# Below this many values a Python loop of bisections beats numpy's fixed cost per call (measured
# on 2 cores: ~25 us for searchsorted + bincount + sum of a handful of values, ~1 us a bisection).
SMALL = 16


def observe_many(child: Any, values: np.ndarray | Sequence[float]) -> None:
    """`child.observe(v)` for every v of `values`, in one pass: one write per bucket that got any,
    one to the sum."""
    if len(values) < SMALL:
        plain = values.tolist() if isinstance(values, np.ndarray) else values
        bounds, buckets = child._upper_bounds, child._buckets
        tally: dict[int, int] = {}
        total = 0.0
        for value in plain:
            total += value
            if value == value:  # NaN fits no bucket
                index = bisect_left(bounds, value)
                tally[index] = tally.get(index, 0) + 1
        if plain:
            child._sum.inc(total)
        for index, count in tally.items():
            buckets[index].inc(count)
        return
    array = np.asarray(values, dtype=np.float64)
    if not array.size:
        return
    bounds = child._upper_bounds
    child._sum.inc(float(array.sum()))
    counts = np.bincount(np.searchsorted(bounds, array, side="left"), minlength=len(bounds) + 1)
    buckets = child._buckets
    for index in np.flatnonzero(counts[: len(bounds)]).tolist():
        buckets[index].inc(int(counts[index]))
