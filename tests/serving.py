"""Start real textserve servers for tests: in-process (create_server) or as a `textserve serve`
child process (for signal tests). Both bind 127.0.0.1 on a free port, wait for readiness by
polling grpc.health.v1 (never a fixed sleep) and stop by themselves when the block ends.

    with running_server(repository) as srv:            # in-process, background event loop
        stub = ClassifierStub(srv.channel())
        srv.call(srv.server.repository.get().batcher.pause)   # run code on the server's loop

    with serve_subprocess(repository, "--max-queue-delay-ms", "5") as proc:
        ...; proc.process.send_signal(signal.SIGTERM)

    poll(lambda: proc.text().count("serving") >= 2, "two workers serving")  # the one poll
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from textserve.bench.process import ServerProcess, spawn
from textserve.bench.process import poll as poll  # the one polling loop of the tests
from textserve.service.config import RuntimeConfig, ServerConfig
from textserve.service.metrics import Metrics
from textserve.service.repository.core import ModelRepository
from textserve.service.server import Server, create_server
from textserve.service.servicers.context import Register

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def health(address: str, service: str = "") -> str:
    with grpc.insecure_channel(address) as channel:
        try:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=5
            )
        except grpc.RpcError as exc:
            return str(exc.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(status.status))


def wait_for_health(
    address: str,
    *,
    service: str = "",
    timeout: float = 60.0,
    alive: Callable[[], bool] = lambda: True,
    credentials: grpc.ChannelCredentials | None = None,
) -> None:
    """Poll grpc.health.v1 Check until `service` is SERVING; raise after `timeout` seconds or
    as soon as `alive()` turns false (the server died). `credentials`: a TLS server's."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    with (
        grpc.insecure_channel(address)
        if credentials is None
        else grpc.secure_channel(address, credentials)
    ) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if not alive():
                raise RuntimeError(f"server at {address} stopped before it was SERVING ({last})")
            try:
                status = stub.Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=1
                ).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
            except grpc.RpcError as exc:
                last = exc.code().name  # UNAVAILABLE until it listens
            time.sleep(0.02)  # polling interval, not a readiness guess
    raise TimeoutError(f"server at {address} not SERVING after {timeout}s (last: {last})")


@dataclass
class RunningServer:
    server: Server
    port: int
    loop: asyncio.AbstractEventLoop
    metrics: Metrics
    credentials: grpc.ChannelCredentials | None = None  # TLS servers: what channel() uses

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def channel(self) -> grpc.Channel:
        if self.credentials is not None:
            return grpc.secure_channel(self.address, self.credentials)
        return grpc.insecure_channel(self.address)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a plain function on the server's event loop thread and return its result."""
        future: Future[T] = Future()

        def invoke() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(invoke)
        return future.result(timeout=30)

    def run(self, coro: Any) -> Any:
        """Run a coroutine on the server's event loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def run_in_background(self, coro: Any) -> Future[Any]:
        """Start a coroutine on the server's event loop; returns a concurrent Future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


def server_config(repository: Path, **overrides: Any) -> ServerConfig:
    """A ServerConfig for tests: 127.0.0.1:0, no metrics HTTP server, one onnxruntime thread
    (the CI machine has two cores shared with the test process)."""
    overrides.setdefault("runtime", RuntimeConfig(intra_op_threads=1))
    overrides.setdefault("metrics_port", None)
    return ServerConfig(repository=Path(repository), listen="127.0.0.1:0", **overrides)


@contextlib.contextmanager
def running_server(
    repository: Path,
    *,
    extra_services: Sequence[Register] = (),
    metrics: Metrics | None = None,
    grace: float = 5.0,
    timeout: float = 60.0,
    wait: bool = True,
    credentials: grpc.ChannelCredentials | None = None,
    **overrides: Any,
) -> Iterator[RunningServer]:
    """A real server from create_server on 127.0.0.1:0, run on an event loop in a background
    thread; SERVING when the block starts (only bound, with wait=False), stopped (drained for
    `grace` s) when it ends. `overrides` are ServerConfig fields (batcher=BatcherConfig(...));
    `credentials`: the channel credentials a TLS server (security=SecurityConfig(...)) needs."""
    config = server_config(repository, **overrides)
    metrics = metrics or Metrics()
    created = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        server, port = create_server(config, metrics=metrics, extra_services=extra_services)
        stop = asyncio.Event()
        state.update(server=server, port=port, stop=stop, loop=asyncio.get_running_loop())
        created.set()
        try:
            await server.start()
        except BaseException as exc:
            state["error"] = exc
            return
        await stop.wait()
        await server.stop(grace)

    def thread_main() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:
            state.setdefault("error", exc)
        finally:
            created.set()

    thread = threading.Thread(target=thread_main, name="textserve-test-server", daemon=True)
    thread.start()
    created.wait(timeout)
    if "server" not in state:
        raise RuntimeError(f"create_server failed: {state.get('error')!r}")
    running = RunningServer(state["server"], state["port"], state["loop"], metrics, credentials)
    try:
        if wait:
            wait_for_health(
                running.address,
                timeout=timeout,
                alive=lambda: "error" not in state,
                credentials=credentials,
            )
        yield running
    finally:
        if thread.is_alive():
            state["loop"].call_soon_threadsafe(state["stop"].set)
            thread.join(timeout=grace + 30)
    if "error" in state:
        raise RuntimeError(f"server failed: {state['error']!r}") from state["error"]


@contextlib.contextmanager
def serve_subprocess(
    repository: Path, *args: str, timeout: float = 90.0, env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    """`textserve serve` as a child process on 127.0.0.1:0 (metrics on a free port too), SERVING
    when the block starts (its --ready-file: textserve.bench.process.spawn); terminated (then
    killed) at the end if still running."""
    command = [
        sys.executable, "-m", "textserve.cli", "serve",
        "--repository", str(repository),
        "--listen", "127.0.0.1:0",
        "--http-port", "0",
        "--intra-op-threads", "1",
        *args,
    ]  # fmt: skip
    with spawn(command, timeout=timeout, env=env, cwd=ROOT) as server:
        yield server


def repository_config(root: Path, **overrides: Any) -> ServerConfig:
    """The serving configuration the repository tests use: one onnxruntime thread, and no
    watching (the tests reconcile by hand) unless told."""
    overrides.setdefault("runtime", RuntimeConfig(device="cpu", intra_op_threads=1))
    overrides.setdefault("poll_interval", 0)
    return ServerConfig(repository=root, metrics_port=None, **overrides)


def run_repository(
    root: Path, body: Callable[[ModelRepository], Awaitable[Any]], **overrides: Any
) -> Metrics:
    """A real ModelRepository over `root` (loaded, not watching unless told: the tests reconcile
    by hand), `body(repository)` run on its event loop, then closed; its metrics."""
    metrics = Metrics(CollectorRegistry())
    run_repository_with(metrics, root, body, **overrides)
    return metrics


def run_repository_with(
    metrics: Metrics | None,
    root: Path,
    body: Callable[[ModelRepository], Awaitable[Any]],
    **overrides: Any,
) -> None:
    """run_repository with these metrics (None: a repository built without any, as the
    repository's own default)."""
    config = repository_config(root, **overrides)

    async def main() -> None:
        repository = ModelRepository.from_server(config, metrics)
        try:
            await repository.load_all()
            await body(repository)
        finally:
            await repository.close()

    asyncio.run(main())
