"""SIGTERM under HTTP load (`textserve serve`, a real process): nothing the server accepted is
lost. Every request the clients saw succeed is one the server counted as OK (its access log),
and every request the server counted was answered: once draining, new requests get 503 (or no
connection at all) while those in flight finish."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import requests

from tests.handmade import make_version
from tests.serving import serve_subprocess

MODEL = "handmade"
CLIENTS = 8


def test_sigterm_under_http_load_loses_nothing_accepted(tmp_path: Path) -> None:
    make_version(tmp_path, MODEL, 1)
    outcomes: dict[str, int] = {"ok": 0, "draining": 0, "refused": 0, "other": 0}
    lock = threading.Lock()
    stop = threading.Event()
    with serve_subprocess(
        tmp_path, "--access-log", "json", "--access-log-rate", "100000",
        "--max-queue-delay-ms", "20", "--grace-period", "20",
    ) as proc:  # fmt: skip
        assert proc.metrics_url is not None
        classify = proc.metrics_url.replace("/metrics", "/v1/classify")

        def client() -> None:
            session = requests.Session()
            while not stop.is_set():
                try:
                    response = session.post(classify, json={"texts": ["a good film"]}, timeout=30)
                except requests.ConnectionError:
                    outcome = "refused"  # the port closed, or a keep-alive raced the close
                    session = requests.Session()
                    time.sleep(0.01)
                else:
                    outcome = {200: "ok", 503: "draining"}.get(response.status_code, "other")
                with lock:
                    outcomes[outcome] += 1

        threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while outcomes["ok"] < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.process.send_signal(signal.SIGTERM)
        assert proc.process.wait(timeout=60) == 0
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    lines = [json.loads(line) for line in proc.output if line.startswith('{"')]
    counted = [line for line in lines if line.get("method") == "HttpClassify"]
    assert outcomes["other"] == 0, outcomes
    assert outcomes["ok"] >= 50
    assert sum(1 for line in counted if line["status"] == "OK") == outcomes["ok"], outcomes
    assert all(line["status"] == "OK" for line in counted)  # none accepted, then cancelled
