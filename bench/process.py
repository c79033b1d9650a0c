"""A `textserve serve` child process for the benchmark: 127.0.0.1, free ports, ready when
grpc.health.v1 says SERVING (polled), stopped with SIGTERM at the end.

    with start_server(Path("models"), "default", ["--max-batch-size", "1"]) as server:
        server.address, server.metrics_url, server.pid

The ports are read from the server's own log lines ("listening on 127.0.0.1:N", "metrics on
http://127.0.0.1:M/metrics"), so nothing guesses a free port ahead of time.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


class ServerStartError(RuntimeError):
    """The server did not become SERVING; the message carries the end of its output."""


@dataclass
class BenchServer:
    address: str  # host:port of gRPC
    metrics_url: str | None  # http://host:port/metrics
    pid: int | None  # for CPU accounting and profiling (py-spy); None for an external server
    command: list[str]


def wait_for_health(address: str, timeout: float, alive: Callable[[], bool] | None = None) -> None:
    """Poll grpc.health.v1 Check("") until SERVING; raise after `timeout` s or when the
    process ends."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if alive is not None and not alive():
                raise ServerStartError(f"the server at {address} exited before SERVING ({last})")
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
            except grpc.RpcError as exc:
                last = exc.code().name
            time.sleep(0.05)  # polling interval, not a readiness guess
    raise ServerStartError(f"the server at {address} was not SERVING after {timeout}s ({last})")


def serve_command(repository: Path, model: str | None, extra_args: Sequence[str] = ()) -> list[str]:
    """`textserve serve` on 127.0.0.1:0 with metrics on a free port."""
    return [
        sys.executable, "-m", "textserve.cli", "--log-level", "INFO", "serve",
        "--repository", str(repository),
        "--listen", "127.0.0.1:0",
        "--metrics-port", "0",
        "--metrics-host", "127.0.0.1",
        *(["--model", model] if model else []),
        *extra_args,
    ]  # fmt: skip


def echo_command() -> list[str]:
    """The model-less gRPC server of textserve.bench.echo on 127.0.0.1:0."""
    return [sys.executable, "-m", "textserve.bench.echo", "127.0.0.1:0"]


@contextlib.contextmanager
def start_server(
    repository: Path,
    model: str | None,
    extra_args: Sequence[str] = (),
    *,
    timeout: float = 120.0,
) -> Iterator[BenchServer]:
    """Run `textserve serve` (see serve_command) until the block ends."""
    with start_process(serve_command(repository, model, extra_args), timeout=timeout) as server:
        yield server


@contextlib.contextmanager
def start_process(command: list[str], *, timeout: float = 120.0) -> Iterator[BenchServer]:
    """Run a server that logs "listening on HOST:PORT" (and maybe "metrics on URL") and serves
    grpc.health.v1; SERVING when the block starts, SIGTERM (then SIGKILL) when it ends."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    tail: deque[str] = deque(maxlen=40)
    found: dict[str, str] = {}
    listening = threading.Event()

    def pump() -> None:  # keep reading so the server never blocks on a full pipe
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line)
            if m := re.search(r"listening on (\S+:\d+)", line):
                found["address"] = m.group(1)
                listening.set()
            if m := re.search(r"metrics on (http://\S+/metrics)", line):
                found["metrics"] = m.group(1)
        listening.set()

    reader = threading.Thread(target=pump, name="bench-server-output", daemon=True)
    reader.start()
    try:
        listening.wait(timeout)
        if "address" not in found:
            raise ServerStartError(
                "textserve serve did not start (" + " ".join(command) + "):\n" + "".join(tail)
            )
        try:
            wait_for_health(found["address"], timeout, alive=lambda: process.poll() is None)
        except ServerStartError as exc:
            raise ServerStartError(f"{exc}\n{''.join(tail)}") from None
        yield BenchServer(found["address"], found.get("metrics"), process.pid, command)
    finally:
        if process.poll() is None:
            process.terminate()  # SIGTERM: a graceful drain, as in production
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        reader.join(timeout=5)
