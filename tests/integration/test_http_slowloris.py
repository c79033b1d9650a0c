"""The HTTP port under a slowloris attack (service/http/server.py): 1,000 connections that each
send half a request cost no thread and little memory, the probes keep answering at once, a
request head that takes longer than --http-header-timeout is closed, and past
--http-max-connections new connections are closed at once. (The thread-per-connection
http.server this replaced held a thread per connection, indefinitely.)"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psutil
import pytest
import requests

from tests.handmade import make_version
from tests.serving import running_server

MODEL = "handmade"
ATTACKERS = 1000
HALF_REQUEST = b"GET /readyz HTTP/1.1\r\nHost: victim\r\nX-Slow: "  # never finished
PROBE_SECONDS = 1.0  # what a probe may take while the attack holds its connections


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    make_version(root, MODEL, 1)
    return root


@contextmanager
def slow_clients(port: int, count: int) -> Iterator[list[socket.socket]]:
    with ExitStack() as stack:
        socks = []
        for _ in range(count):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
            sock.sendall(HALF_REQUEST)
            socks.append(sock)
        yield socks


def closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_thousand_slowloris_connections_cost_no_threads_and_probes_answer(
    repository: Path,
) -> None:
    process = psutil.Process()
    with running_server(repository, metrics_port=0) as srv:
        port = srv.server.metrics_port or 0
        base = f"http://127.0.0.1:{port}"
        assert requests.get(base + "/readyz", timeout=10).status_code == 200
        threads, rss = threading.active_count(), process.memory_info().rss
        with slow_clients(port, ATTACKERS) as socks:
            time.sleep(0.5)  # the server has taken them all (a thread each, were there threads)
            for path in ("/healthz", "/readyz", "/metrics"):
                started = time.monotonic()
                response = requests.get(base + path, timeout=10)
                assert response.status_code == 200, path
                assert time.monotonic() - started < PROBE_SECONDS, path
            grown_threads = threading.active_count() - threads
            grown_mib = (process.memory_info().rss - rss) / 2**20
            assert grown_threads < 10, grown_threads
            # the test's own 1,000 client sockets are in this process too
            assert grown_mib < 64, grown_mib
            assert not closed_by_server(socks[0], 0.1)  # held within the header timeout


def test_a_slow_request_head_is_closed_and_connections_are_bounded(repository: Path) -> None:
    from textserve.service.config import HttpConfig

    http = HttpConfig(header_timeout=1.0, max_connections=40)
    with running_server(repository, metrics_port=0, http=http) as srv:
        port = srv.server.metrics_port or 0
        with slow_clients(port, 30) as socks:
            started = time.monotonic()
            assert all(closed_by_server(s, 5.0) for s in socks)  # the header timeout
            assert time.monotonic() - started < 4.0
        with slow_clients(port, 50) as socks:
            time.sleep(0.3)
            refused = [s for s in socks if closed_by_server(s, 0.2)]
            assert len(refused) >= 10  # past the limit: closed at once, not served
        # the limit frees as connections go: probes answer again at once
        response = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
        assert response.status_code == 200
