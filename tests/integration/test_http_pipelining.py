"""HTTP/1.1 pipelining is bounded (service/http/server.py): a client that sends requests ahead
of their answers gets them answered in order up to `Bounds.max_pipelined` at a time; one that
sends tens of thousands without reading is closed, and the server's memory stays where it was.
(uvicorn queued every pipelined request it parsed: 10 such connections took a worker from 179
to 846 MB, never given back.)"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from pathlib import Path

import psutil
import pytest
import requests

from tests.handmade import make_version
from tests.serving import running_server

MODEL = "handmade"
PROBE = b"GET /healthz HTTP/1.1\r\nHost: victim\r\n\r\n"
FLOOD = 30_000  # requests each hostile connection sends without reading an answer
CONNECTIONS = 10


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    make_version(root, MODEL, 1)
    return root


def read_answers(sock: socket.socket, count: int) -> list[bytes]:
    """The status lines of `count` answers read from a keep-alive connection."""
    data = b""
    sock.settimeout(10)
    while data.count(b"HTTP/1.1 ") < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return re.findall(rb"HTTP/1\.1 \d{3} [A-Za-z ]+", data)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes the connection within `seconds` (answers read and dropped)."""
    sock.settimeout(0.5)
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            if sock.recv(1 << 20) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset
            return True
    return False


def test_pipelined_requests_are_answered_in_order(repository: Path) -> None:
    with running_server(repository, metrics_port=0) as srv:
        port = srv.server.metrics_port or 0
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            requests_ = [
                b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
                b"GET /nowhere HTTP/1.1\r\nHost: a\r\n\r\n",
            ] * 16
            sock.sendall(b"".join(requests_))
            lines = read_answers(sock, len(requests_))
        assert lines == [b"HTTP/1.1 200 OK", b"HTTP/1.1 404 Not Found"] * 16


def test_a_pipelining_flood_is_closed_and_costs_no_memory(repository: Path) -> None:
    process = psutil.Process()
    with running_server(repository, metrics_port=0) as srv:
        port = srv.server.metrics_port or 0
        base = f"http://127.0.0.1:{port}"
        assert requests.get(base + "/readyz", timeout=10).status_code == 200
        rss = process.memory_info().rss
        flood = PROBE * FLOOD
        address = ("127.0.0.1", port)
        socks = [socket.create_connection(address, timeout=10) for _ in range(CONNECTIONS)]
        try:
            for sock in socks:
                sock.settimeout(2)
                with contextlib.suppress(OSError):  # the server stops reading and closes
                    sock.sendall(flood)
            closed = [closed_within(sock, 20) for sock in socks]
            grown_mib = (process.memory_info().rss - rss) / 2**20
            started = time.monotonic()
            assert requests.get(base + "/readyz", timeout=10).status_code == 200
            probe_seconds = time.monotonic() - started
        finally:
            for sock in socks:
                sock.close()
        assert all(closed), closed
        # the test's own send buffers are in this process too; uvicorn's queue took ~60 MB a
        # connection here
        assert grown_mib < 64, grown_mib
        assert probe_seconds < 1.0, probe_seconds
