"""Read a textserve server's Prometheus metrics: CPU time, batch sizes, padding, provider.

    before = parse_sample(fetch(url)); ...; after = parse_sample(fetch(url))
    server_delta(before, after, cpus)["cpu_per_text_ms"]

CPU per text divides the server's process CPU by the texts its batcher ran between the same
two scrapes (textserve_batch_size_sum), so numerator and denominator cover the same interval.
"""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from textserve import procfs


@dataclass(frozen=True)
class ServerSample:
    """Cumulative counters of one scrape (summed over models unless one is chosen)."""

    at: float  # time.perf_counter() when the scrape returned
    cpu_seconds: float | None  # process_cpu_seconds_total (None: not exposed, e.g. not Linux)
    batches: float = 0.0  # textserve_batch_size_count
    items: float = 0.0  # textserve_batch_size_sum: texts that went through the model
    padding_sum: float = 0.0  # textserve_batch_padding_ratio_sum
    padding_count: float = 0.0
    providers: dict[str, str] = field(default_factory=dict)  # model -> execution provider


def parse_sample(text: str, model: str | None = None, at: float | None = None) -> ServerSample:
    """A ServerSample from the Prometheus text format; `model` keeps only that model's series."""
    cpu: float | None = None
    sums: dict[str, float] = {
        "textserve_batch_size_count": 0.0,
        "textserve_batch_size_sum": 0.0,
        "textserve_batch_padding_ratio_sum": 0.0,
        "textserve_batch_padding_ratio_count": 0.0,
    }
    providers: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == "process_cpu_seconds_total":
                cpu = float(value)
            elif name in sums:
                if model is None or labels.get("model") == model:
                    sums[name] += float(value)
            elif name == "textserve_model_info" and value == 1:
                providers[labels.get("model", "")] = labels.get("provider", "")
    return ServerSample(
        at=time.perf_counter() if at is None else at,
        cpu_seconds=cpu,
        batches=sums["textserve_batch_size_count"],
        items=sums["textserve_batch_size_sum"],
        padding_sum=sums["textserve_batch_padding_ratio_sum"],
        padding_count=sums["textserve_batch_padding_ratio_count"],
        providers=providers,
    )


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process from /proc (None where there is none), for
    servers without a metrics endpoint."""
    stat = procfs.process_stat(pid)
    return None if stat is None else stat.cpu_seconds


def fetch(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode("utf-8"))


def scrape(url: str, model: str | None = None) -> ServerSample:
    return parse_sample(fetch(url), model)


def server_delta(before: ServerSample, after: ServerSample, cpus: int) -> dict[str, Any]:
    """What the server did between two scrapes: texts, batches, mean batch size, mean padding
    ratio per batch, CPU seconds, CPU per text (ms) and CPU share of the whole machine."""
    wall = after.at - before.at
    items = after.items - before.items
    batches = after.batches - before.batches
    padded = after.padding_count - before.padding_count
    out: dict[str, Any] = {
        "texts": items,
        "batches": batches,
        "mean_batch_size": items / batches if batches else None,
        "padding_ratio": (after.padding_sum - before.padding_sum) / padded if padded else None,
        "cpu_seconds": None,
        "cpu_per_text_ms": None,
        "cpu_share": None,
    }
    if before.cpu_seconds is not None and after.cpu_seconds is not None:
        cpu = after.cpu_seconds - before.cpu_seconds
        out["cpu_seconds"] = cpu
        out["cpu_per_text_ms"] = cpu / items * 1e3 if items else None
        out["cpu_share"] = cpu / (wall * cpus) if wall > 0 else None
    return out
