"""Pure figures of a benchmark step: latency percentiles and the per-step summary.

summary = summarize(raw, window_seconds=5.0)   # raw: latencies, error codes, text counts
summary["latency_ms"]["p99"]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from textserve import procfs

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)


def percentiles(
    values: Sequence[float] | np.ndarray, qs: Iterable[float] = PERCENTILES
) -> dict[str, float]:
    """p50/p90/... and max of `values` (nearest rank: every figure is a latency that happened).

    >>> percentiles([1, 2, 3, 4], (50, 100))
    {'p50': 2.0, 'p100': 4.0, 'max': 4.0}

    An empty sequence gives NaN for each (no successful request: nothing to report).
    """
    data = np.sort(np.asarray(values, dtype=np.float64))
    out: dict[str, float] = {}
    for q in qs:
        if not 0 <= q <= 100:
            raise ValueError(f"percentile must be within 0-100, got {q}")
        key = f"p{q:g}"
        if data.size == 0:
            out[key] = float("nan")
            continue
        # nearest rank: the smallest value with at least q% of the values at or below it
        rank = max(1, int(np.ceil(q / 100.0 * data.size)))
        out[key] = float(data[rank - 1])
    out["max"] = float(data[-1]) if data.size else float("nan")
    return out


@dataclass
class RawStep:
    """What the load generator saw in one measured window."""

    latencies: list[float] = field(default_factory=list)  # seconds, successful requests
    requests_done: int = 0  # successful requests completed inside the window
    texts: int = 0  # texts of those requests
    errors: Counter[str] = field(default_factory=Counter)  # gRPC code name -> count
    window_seconds: float = 0.0  # length of the measured window
    loadgen_cpu_seconds: float = 0.0  # CPU time of the load generator process(es) in the window
    not_sent: int = 0  # open loop: arrivals dropped because too many were in flight
    machine_cpu_share: float | None = None  # busy share of all CPUs in the window (/proc/stat)
    # seconds from send (open loop: scheduled arrival) to each error, by code: how fast refused
    error_latencies: dict[str, list[float]] = field(default_factory=dict)
    # open loop: (scheduled arrival - window start, seconds to the answer, error code or None)
    # for each arrival in the window: the run second by second (bench.overload's timeline)
    outcomes: list[tuple[float, float, str | None]] = field(default_factory=list)

    def merge(self, other: RawStep) -> None:
        """Fold in another process's share of the same window."""
        self.latencies.extend(other.latencies)
        self.requests_done += other.requests_done
        self.texts += other.texts
        self.errors.update(other.errors)
        for code, seconds in other.error_latencies.items():
            self.error_latencies.setdefault(code, []).extend(seconds)
        self.window_seconds = max(self.window_seconds, other.window_seconds)
        self.loadgen_cpu_seconds += other.loadgen_cpu_seconds
        self.not_sent += other.not_sent
        self.outcomes.extend(other.outcomes)


parse_proc_stat = procfs.parse_cpu_line  # (busy, total) jiffies of /proc/stat's text
read_machine_cpu = procfs.machine_jiffies  # (busy, total) jiffies now, or None


def summarize(raw: RawStep, cpus: int) -> dict[str, Any]:
    """Throughput, latency percentiles (ms), errors and the load generator's CPU share."""
    window = raw.window_seconds
    if window <= 0:
        raise ValueError("a step needs a measured window longer than 0 seconds")
    lat_ms = np.asarray(raw.latencies, dtype=np.float64) * 1e3
    latency = percentiles(lat_ms)
    latency["mean"] = float(lat_ms.mean()) if lat_ms.size else float("nan")
    return {
        "requests": raw.requests_done,
        "texts": raw.texts,
        "window_s": window,
        "throughput_requests_per_s": raw.requests_done / window,
        "throughput_texts_per_s": raw.texts / window,
        "latency_ms": latency,
        "errors": dict(sorted(raw.errors.items())),
        "error_latency_ms": {
            code: percentiles(np.asarray(seconds, dtype=np.float64) * 1e3)
            for code, seconds in sorted(raw.error_latencies.items())
        },
        "not_sent": raw.not_sent,
        "loadgen": {
            "cpu_seconds": raw.loadgen_cpu_seconds,
            # share of the machine (all cores), comparable with the server's share
            "cpu_share": raw.loadgen_cpu_seconds / (window * cpus),
        },
        # everything running on the machine: server + load generator + anything else
        "machine_cpu_share": raw.machine_cpu_share,
    }
