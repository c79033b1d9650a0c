"""Client and AsyncClient balance per request over several servers (round_robin), and a
request to a server that is gone is retried on another (UNAVAILABLE is in the retry policy)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from tests.handmade import make_version
from tests.serving import RunningServer, running_server
from textserve.client import AsyncClient, Client


def served(srv: RunningServer) -> float:
    value = srv.metrics.registry.get_sample_value(
        "textserve_requests_total", {"method": "Classify", "model": "handmade"}
    )
    return value or 0.0


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    make_version(tmp_path / "models", "handmade", 1)
    return tmp_path / "models"


def test_client_and_async_client_spread_requests_over_every_server(repository: Path) -> None:
    with running_server(repository) as a, running_server(repository) as b:
        with Client([a.address, b.address], timeout=30) as client:
            for _ in range(20):
                client.classify(["spread me"])
        assert served(a) > 0 and served(b) > 0
        assert served(a) + served(b) == 20

        async def main() -> None:
            async with AsyncClient(f"{a.address},{b.address}", timeout=30) as client:
                await asyncio.gather(*(client.classify(["spread me"]) for _ in range(20)))

        asyncio.run(main())
        assert served(a) + served(b) == 40


def test_a_server_that_is_gone_is_skipped_without_a_failed_request(repository: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    with running_server(repository) as alive, Client([dead, alive.address], timeout=30) as client:
        for _ in range(10):
            assert client.classify(["still answered"]).predictions
        assert served(alive) == 10


def test_a_server_that_is_not_serving_gets_no_requests_until_it_serves_again(
    repository: Path,
) -> None:
    """Client-side health checking (healthCheckConfig): round_robin picks only replicas whose
    grpc.health.v1 status is SERVING, e.g. not one that is warming up or draining."""
    from textserve.service.health import NOT_SERVING, SERVING

    with running_server(repository) as a, running_server(repository) as b:

        def set_health(status: int) -> None:
            asyncio.run_coroutine_threadsafe(b.server.health.set("", status), b.loop).result(30)

        set_health(NOT_SERVING)
        with Client([a.address, b.address], timeout=30) as client:
            for _ in range(20):
                client.classify(["only a"])
            assert (served(a), served(b)) == (20, 0)
            set_health(SERVING)
            for _ in range(200):  # the watch tells the client within a moment
                client.classify(["both again"])
                if served(b):
                    break
            assert served(b) > 0
