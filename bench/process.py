"""THE helper that runs a server as a child process (the benchmark's and the tests'): on
127.0.0.1 with free ports, ready when it writes its --ready-file (JSON: pid, grpc address,
metrics URL), stopped with SIGTERM (then SIGKILL) at the end.

    with start_server(Path("models"), "default", ["--max-batch-size", "1"]) as server:
        server.address, server.metrics_url, server.pid
    with spawn([sys.executable, "-m", "textserve.cli", "serve", ...]) as server:
        server.process.send_signal(signal.SIGTERM); server.text()  # what it printed so far

`textserve serve` writes the ready file once it is SERVING (every worker with --workers), so
nothing guesses a free port ahead of time or reads ports out of log lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ServerStartError(RuntimeError):
    """The server did not become ready; the message carries the end of its output."""


@dataclass
class BenchServer:
    address: str  # host:port of gRPC
    metrics_url: str | None  # http://host:port/metrics
    pid: int | None  # for CPU accounting and profiling (py-spy); None for an external server
    command: list[str]


@dataclass
class ServerProcess(BenchServer):
    """A server this module started: its process, what it wrote in its ready file, and every
    line it printed so far (when its output is not sent to a log file)."""

    process: subprocess.Popen[str] = field(repr=False)
    ready: dict[str, Any] = field(default_factory=dict)
    output: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(self.output)


def poll(
    condition: Callable[[], T | None],
    what: str,
    timeout: float = 60.0,
    interval: float = 0.05,
) -> T:
    """`condition()`'s first truthy value, asked every `interval` s; TimeoutError naming
    `what` after `timeout` s. The one polling loop of the tests and the benchmark: readiness is
    polled, never guessed with a fixed sleep."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)  # polling interval, not a readiness guess


def serve_command(repository: Path, model: str | None, extra_args: Sequence[str] = ()) -> list[str]:
    """`textserve serve` on 127.0.0.1:0 with metrics on a free port."""
    return [
        sys.executable, "-m", "textserve.cli", "--log-level", "INFO", "serve",
        "--repository", str(repository),
        "--listen", "127.0.0.1:0",
        "--http-port", "0",
        "--http-host", "127.0.0.1",
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
) -> Iterator[ServerProcess]:
    """Run `textserve serve` (see serve_command) until the block ends."""
    with spawn(serve_command(repository, model, extra_args), timeout=timeout) as server:
        yield server


@contextlib.contextmanager
def start_process(command: list[str], *, timeout: float = 120.0) -> Iterator[ServerProcess]:
    """Run a server that takes --ready-file (textserve serve, textserve.bench.echo) until the
    block ends."""
    with spawn(command, timeout=timeout) as server:
        yield server


def _placement(niceness: int, cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """What the child runs before exec: its niceness and CPUs, or None when neither is asked."""
    if not niceness and cpus is None:
        return None

    def place() -> None:
        if niceness:
            os.nice(niceness)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return place


@contextlib.contextmanager
def spawn(
    command: Sequence[str],
    *,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    log: Path | None = None,
    stop_timeout: float = 30.0,
    inherit_env: bool = True,
    niceness: int = 0,
    cpus: frozenset[int] | None = None,
) -> Iterator[ServerProcess]:
    """Run `command --ready-file PATH` (a server that writes PATH once it serves) until the
    block ends; its output is kept in memory (`.text()`) or written to `log`. On exit: SIGTERM,
    the graceful drain, and SIGKILL if it has not stopped within `stop_timeout` s.
    ServerStartError with the end of its output when it exits or times out before ready.
    `env` is added to this process's environment, or with inherit_env=False is all of it (an
    installed server that must not see this checkout's PYTHONPATH). `niceness` is added to the
    server's (and so its workers' and threads') scheduling niceness: a load generator on the
    same cores then gets the CPU it needs first (bench.overload --server-nice). `cpus` pins the
    server (its workers and threads) to those CPUs, so that a load generator pinned to the others
    never takes the server's (bench.overload --server-cpus)."""
    with tempfile.TemporaryDirectory(prefix="textserve-ready-") as folder:
        ready_file = Path(folder) / "ready.json"
        full = [*command, "--ready-file", str(ready_file)]
        output: list[str] = []
        with contextlib.ExitStack() as stack:
            sink: Any = stack.enter_context(log.open("w")) if log is not None else subprocess.PIPE
            process = subprocess.Popen(
                full,
                cwd=cwd,
                stdout=sink,
                stderr=subprocess.STDOUT,
                text=True,
                env={**(os.environ if inherit_env else {}), "PYTHONUNBUFFERED": "1", **(env or {})},
                preexec_fn=_placement(niceness, cpus),
            )
        reader = threading.Thread(
            target=lambda: output.extend(process.stdout or ()), name="server-output", daemon=True
        )
        reader.start()  # keep reading so the server never blocks on a full pipe
        try:
            ready = _wait_ready(ready_file, process, full, timeout, lambda: _tail(output, log))
            yield ServerProcess(
                address=str(ready["grpc"]),
                metrics_url=ready.get("metrics"),
                pid=process.pid,
                command=full,
                process=process,
                ready=ready,
                output=output,
            )
        finally:
            stop(process, stop_timeout)
            reader.join(timeout=5)


def stop(process: subprocess.Popen[Any], timeout: float = 30.0) -> int:
    """SIGTERM (a graceful drain, as in production), SIGKILL after `timeout` s; the status."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def _wait_ready(
    path: Path,
    process: subprocess.Popen[Any],
    command: Sequence[str],
    timeout: float,
    tail: Callable[[], str],
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise ServerStartError(
                f"{' '.join(command)} exited with status {process.returncode} "
                f"before it was ready:\n{tail()}"
            )
        if time.monotonic() > deadline:
            raise ServerStartError(f"not ready after {timeout:g}s:\n{tail()}")
        time.sleep(0.05)  # polling interval, not a readiness guess
    data: dict[str, Any] = json.loads(path.read_text())  # written whole (renamed into place)
    return data


def _tail(output: list[str], log: Path | None, lines: int = 40) -> str:
    text = log.read_text(errors="replace") if log is not None else "".join(output)
    return "".join(text.splitlines(keepends=True)[-lines:])
