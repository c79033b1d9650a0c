"""textserve.commands.probe (the image's HEALTHCHECK) against a real gRPC health service."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from textserve.commands.probe import main, probe


@pytest.fixture
def health_server() -> Iterator[tuple[health.HealthServicer, str]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def test_serving_server_passes(health_server: tuple[health.HealthServicer, str]) -> None:
    servicer, address = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert probe(address) == (True, f"{address}: SERVING")
    assert main(["--address", address]) == 0


def test_not_serving_server_fails(health_server: tuple[health.HealthServicer, str]) -> None:
    servicer, address = health_server
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert probe(address) == (False, f"{address}: NOT_SERVING")
    assert main(["--address", address]) == 1


def test_a_named_service_is_checked(health_server: tuple[health.HealthServicer, str]) -> None:
    servicer, address = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    servicer.set("textserve.v1.Classifier", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert main(["--address", address, "--service", "textserve.v1.Classifier"]) == 1
    serving, seen = probe(address, "no.such.Service")
    assert not serving and "NOT_FOUND" in seen


def test_unreachable_server_fails_with_a_message() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serving, seen = probe(f"127.0.0.1:{port}", timeout=2)
    assert not serving and "UNAVAILABLE" in seen


def test_runs_as_a_module_like_the_healthcheck(
    health_server: tuple[health.HealthServicer, str],
) -> None:
    servicer, address = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    done = subprocess.run(
        [sys.executable, "-m", "textserve.commands.probe", "--address", address],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "SERVING" in done.stderr
