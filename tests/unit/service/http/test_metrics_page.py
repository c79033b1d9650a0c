"""/metrics is rendered off the event loop, once for the scrapes that ask at the same time."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from textserve.service.http.routes import local_metrics


class Slow(Collector):
    """A collector that takes 0.2 s and counts its collections and the threads they ran on."""

    def __init__(self) -> None:
        self.calls = 0
        self.threads: set[int] = set()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.calls += 1
        self.threads.add(threading.get_ident())
        time.sleep(0.2)
        yield GaugeMetricFamily("slow", "a slow series", value=1.0)


def test_concurrent_scrapes_share_one_render_off_the_loop() -> None:
    registry = CollectorRegistry()
    slow = Slow()
    registry.register(slow)
    requests = Counter("requests", "answered", registry=registry)
    page = local_metrics(registry)

    async def main() -> tuple[list[bytes], int]:
        ticks = 0

        async def ticker() -> None:  # the loop keeps running while the page renders
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        tick = asyncio.create_task(ticker())
        pages = await asyncio.gather(*(page(None) for _ in range(8)))
        tick.cancel()
        return [p.body for p in pages], ticks

    bodies, ticks = asyncio.run(main())
    assert slow.calls == 1  # eight scrapes, one render
    assert threading.get_ident() not in slow.threads  # rendered on a worker thread
    assert ticks >= 5  # the loop ran during the 0.2 s render
    assert all(b"slow 1.0" in body for body in bodies)
    # nothing kept: the next scrape renders again and sees what happened since
    requests.inc()
    body = asyncio.run(page(None)).body
    assert slow.calls == 2 and b"requests_total 1.0" in body
