"""Overload over HTTP (issue 39): past --max-concurrent-rpcs inference requests in flight in a
process, a new one is answered 429 with Retry-After at once, in its API's own error shape,
before its body is read, and counted; the probes and the requests already taken are not
touched. (gRPC's calls past the same bound are refused by grpc.aio itself: test_backlog.)"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from tests.handmade import make_version
from tests.serving import poll, running_server
from textserve.service.config import BatcherConfig

MODEL = "handmade"


def test_past_the_bound_a_request_is_429_at_once(tmp_path: Path) -> None:
    make_version(tmp_path, MODEL, 1)
    # a lone text waits 3 s for its batch to fill: the first request stays in flight
    batcher = BatcherConfig(max_queue_delay=3.0)
    with (
        running_server(tmp_path, metrics_port=0, max_concurrent_rpcs=1, batcher=batcher) as srv,
        ThreadPoolExecutor(1) as pool,
    ):
        url = f"http://127.0.0.1:{srv.server.metrics_port}"
        registry = srv.metrics.registry
        first = pool.submit(
            requests.post, f"{url}/v1/classify", json={"texts": ["good"]}, timeout=30
        )
        poll(
            lambda: registry.get_sample_value("textserve_inflight_texts", {"model": MODEL}),
            "the first request in the queue",
        )
        started = time.monotonic()
        refused = requests.post(f"{url}/v1/classify", json={"texts": ["a film"]}, timeout=30)
        waited = time.monotonic() - started
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "1"
        body = refused.json()
        assert body["code"] == "RESOURCE_EXHAUSTED" and "--max-concurrent-rpcs" in body["error"]
        assert waited < 1.0  # at once, not after the first request's 3 s
        tei = requests.post(f"{url}/predict", json={"inputs": "a film"}, timeout=30)
        assert tei.status_code == 429
        assert tei.json()["error_type"] == "Overloaded"  # TEI's own shape
        assert requests.get(f"{url}/readyz", timeout=5).status_code == 200  # probes: no bound
        assert first.result().status_code == 200  # the request already taken is answered
        after = requests.post(f"{url}/v1/classify", json={"texts": ["a film"]}, timeout=30)
        assert after.status_code == 200  # the bound counts requests in flight, not ever made
        counted = registry.get_sample_value(
            "textserve_request_limit_refusals_total",
            {"method": "HttpClassify", "limit": "concurrent_requests"},
        )
        assert counted == 2
