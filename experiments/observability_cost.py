"""`python experiments/observability_cost.py`: the CPU time observing one request costs,
for each observability setting, measured in process on the request-observation path itself.

Each setting runs the same request observation as the servers' front ends (status.observed:
metrics, tracing, access log) N times around a fixed result and reports CPU microseconds per
request (time.process_time of the whole process: the span export thread and the OTLP sink it
exports to, in this process, included). A traced request also makes one batch span, as if each
sampled request ran in a batch of its own: an upper bound (a batch span is shared by the
sampled requests it carried). Compare the figures with the server's CPU per text that
`textserve bench` reports (ms/text).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from textserve.bench.otlp_sink import otlp_sink
from textserve.service.access_log import AccessLog
from textserve.service.dataplane.context import Telemetry
from textserve.service.dataplane.observe import observed
from textserve.service.engine.batcher import RunStats
from textserve.service.engine.handle import ClassifyResult, Timings
from textserve.service.metrics import Metrics
from textserve.service.tracing import Tracing

TEXTS = ["a gripping, beautifully acted film"]
RUNS = (RunStats(size=4, padded_tokens=48, real_tokens=40, seconds=0.002),)
ATTRIBUTES: dict[str, str | int] = {
    "textserve.model": "m",
    "textserve.model.version": 1,
    "textserve.provider": "CPU",
}


class _Context:
    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("user-agent", "grpc-python/1.0"),)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:54321"


def _per_request(metrics: Metrics, telemetry: Telemetry | None, n: int) -> tuple[float, float]:
    """CPU microseconds per observed request: on the calling thread (the server's event loop:
    what requests wait for), and in the whole process (the export thread and sink too)."""
    context = _Context()
    result = ClassifyResult(
        probabilities=np.asarray([[0.2, 0.8]], np.float32),
        num_tokens=np.asarray([9]),
        truncated=np.asarray([False]),
        timings=Timings(0.001, 0.0002, 0.002, 0.004),
    )
    started, started_thread = time.process_time(), time.thread_time()
    for _ in range(n):
        with observed(metrics, "Classify", None, context=context, telemetry=telemetry) as seen:
            seen.reached("m", 1, TEXTS)
            seen.result = result
            if seen.trace is not None and seen.trace.sampled:
                seen.trace.on_batch([seen.trace], 0.003, 0.002, RUNS, ATTRIBUTES)
    thread = time.thread_time() - started_thread
    if telemetry is not None and telemetry.tracing is not None:
        telemetry.tracing.flush()  # the export of those spans counts too
    return thread / n * 1e6, (time.process_time() - started) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000, help="per setting (20000)")
    args = parser.parse_args(argv)
    n = args.requests
    metrics = Metrics(CollectorRegistry())
    metrics.init_model("m")
    devnull = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the measurement)
    logger = logging.getLogger("textserve.bench.access")
    logger.addHandler(logging.StreamHandler(devnull))
    logger.setLevel(logging.INFO)
    logger.propagate = False
    _per_request(metrics, None, n // 10)  # warm
    rows: list[tuple[str, tuple[float, float]]] = []
    off = Telemetry()  # what a server without the flags passes
    rows.append(("metrics only (tracing and access log off)", _per_request(metrics, off, n)))
    with otlp_sink() as sink:
        for ratio in (0.1, 1.0):
            tracing = Tracing(sink.endpoint, ratio, metrics=metrics)
            label = f"tracing on, {ratio:.0%} sampled (OTLP export to a sink)"
            rows.append((label, _per_request(metrics, Telemetry(tracing=tracing), n)))
            tracing.shutdown()
        spans = sink.spans
    access: Any = AccessLog(rate=1e9, metrics=metrics, emit=logger.info)
    rows.append(
        ("access log json (to /dev/null)", _per_request(metrics, Telemetry(None, access), n))
    )
    (loop0, total0) = rows[0][1]
    print(f"{'CPU µs per request':<55} {'loop thread':>16} {'whole process':>16}")
    for label, (loop, total) in rows:
        print(
            f"{label:<55} {loop:7.1f} (+{loop - loop0:5.1f}) {total:7.1f} (+{total - total0:5.1f})"
        )
    print(f"({n} requests per setting; {spans} spans exported)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
