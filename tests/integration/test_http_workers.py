"""--workers N and the HTTP port: every worker listens on it (SO_REUSEPORT, as on gRPC), and
whichever worker a connection reaches, /metrics is the whole server's (every worker summed:
the supervisor's, behind each worker's port) and /readyz is the supervisor's readiness."""

from __future__ import annotations

from pathlib import Path

import psutil
import requests

from tests.handmade import make_version
from tests.serving import serve_subprocess

MODEL = "handmade"
REQUESTS = 40


def http_requests(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("textserve_requests_total{") and 'method="HttpClassify"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_every_worker_serves_the_http_port_with_one_metrics(tmp_path: Path) -> None:
    make_version(tmp_path, MODEL, 1)
    with serve_subprocess(tmp_path, "--workers", "2") as server:
        assert server.metrics_url is not None
        port = int(server.metrics_url.rsplit(":", 1)[1].split("/")[0])
        grpc_port = int(server.address.rsplit(":", 1)[1])
        listening = [
            {c.laddr.port for c in child.net_connections("tcp") if c.status == "LISTEN"}
            for child in psutil.Process(server.process.pid).children()
        ]
        workers = [ports for ports in listening if grpc_port in ports]  # not spawn's tracker
        assert len(workers) == 2
        assert all(port in ports for ports in workers), (port, workers)
        base = server.metrics_url.removesuffix("/metrics")
        for _ in range(REQUESTS):  # a new connection each: the kernel spreads them
            answer = requests.post(
                base + "/v1/classify",
                json={"texts": ["a good film"]},
                headers={"Connection": "close"},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
        for _ in range(4):  # every scrape, whichever worker answers it, counts them all
            page = requests.get(server.metrics_url, headers={"Connection": "close"}, timeout=30)
            assert http_requests(page.text) == REQUESTS
            assert "textserve_workers 2.0" in page.text  # the supervisor's own series
        ready = requests.get(base + "/readyz", timeout=30)
        assert (ready.status_code, ready.text.strip()) == (200, "serving")
