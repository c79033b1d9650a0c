"""One worker process of `textserve serve --workers N`: a whole server (sessions, batcher,
watcher, gRPC on the shared port) linked to its supervisor (service/supervisor.py) by a pipe.

    worker_main(spec, conn)       # the target of the supervisor's spawned process

What goes over the pipe (tuples, pickled by multiprocessing):

  worker -> supervisor                      supervisor -> worker
  ("warm",)      models loaded and warm     ("serve",)   every worker is warm: SERVING
  ("state", S)   readiness (/readyz)        ("apply", KEY, OP, NAME, VERSION)  an admin change
  ("failed", M)  startup failed: M          ("relayed", ID, ERROR)  the others applied ID
  ("relay", ID, OP, NAME, VERSION)  an admin call changed this worker: apply it everywhere
  ("applied", KEY, ERROR)  done (ERROR: None or what went wrong)

Admin changes (LoadModel, UnloadModel, ReloadRepository) are relayed rather than shared
through a file: the call returns only once every worker has applied it, errors come back to
the caller, and the supervisor keeps the list to replay to a worker it restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from textserve.service.config import ServerConfig

if TYPE_CHECKING:
    from textserve.service.server import Server

logger = logging.getLogger(__name__)

AdminOp = tuple[str, str, int | None]  # ("load" | "unload" | "reload", model, version)


@dataclass(frozen=True)
class WorkerSpec:
    index: int  # 1..N, stays the same across restarts
    config: ServerConfig  # the listen address with the port the supervisor reserved
    metrics_dir: str  # PROMETHEUS_MULTIPROC_DIR
    log_level: str
    replay: tuple[AdminOp, ...] = ()  # admin changes made before this worker started


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Serve until SIGTERM/SIGINT (forwarded by the supervisor) or until the supervisor goes
    away; exits with serve()'s status, or 2 after telling the supervisor why startup failed."""
    # A terminal's Ctrl-C goes to the supervisor only; it forwards it (once per press).
    os.setpgrp()
    # Before any metric exists: every metric of this process goes to the shared files.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = spec.metrics_dir
    from prometheus_client import values

    values.ValueClass = values.get_value_class()
    logging.basicConfig(
        level=getattr(logging, spec.log_level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s worker-{spec.index} %(name)s: %(message)s",
    )
    from textserve.service.config import ConfigError
    from textserve.service.engine.runtime import DeviceUnavailableError
    from textserve.service.repository.core import StartupError
    from textserve.service.server import serve

    link = WorkerLink(spec, conn)
    try:
        code = asyncio.run(serve(spec.config, worker=link))
    except (StartupError, DeviceUnavailableError, OSError, ConfigError) as exc:
        link.send(("failed", str(exc)))
        sys.exit(2)
    sys.exit(code)


class WorkerLink:
    """This worker's end of the pipe, on the server's event loop (serve() attaches it)."""

    def __init__(self, spec: WorkerSpec, conn: Connection) -> None:
        self.spec = spec
        self._conn = conn
        self._server: Server | None = None
        self._pending: dict[int, asyncio.Future[str | None]] = {}
        self._next_id = 0
        self._inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self._go = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stop: Any = None

    def send(self, message: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError, ValueError):  # the supervisor is gone: reader notices
            self._conn.send(message)

    def attach(self, server: Server, stop: Any) -> None:
        """Hook into `server` before it starts; `stop()` drains it (the supervisor is gone)."""
        self._server = server
        self._stop = stop
        server.health.worker = f"{self.spec.index}/{os.getpid()}"
        server.before_serving = self._before_serving
        server.on_readiness = lambda state: self.send(("state", state))
        server.ctx.relay = self.relay
        loop = asyncio.get_running_loop()
        loop.add_reader(self._conn.fileno(), self._readable)
        self._tasks.append(loop.create_task(self._apply_in_order()))

    async def _before_serving(self) -> None:
        for op in self.spec.replay:  # what an admin changed before this worker (re)started
            if error := await self._apply(*op):
                logger.warning("replaying admin %s %s: %s", op[0], op[1], error)
        self.send(("warm",))
        await self._go.wait()  # the supervisor says when every worker is warm

    def _readable(self) -> None:
        try:
            while self._conn.poll():
                message = self._conn.recv()
                if message[0] == "relayed":
                    future = self._pending.pop(message[1], None)
                    if future is not None and not future.done():
                        future.set_result(message[2])
                else:  # "serve" and "apply": in the order they came
                    self._inbox.put_nowait(message)
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(self._conn.fileno())
            for future in self._pending.values():
                if not future.done():
                    future.set_result("the supervisor is gone")
            logger.warning("the supervisor is gone: draining")
            self._stop()

    async def _apply_in_order(self) -> None:
        while True:
            message = await self._inbox.get()
            if message[0] == "serve":
                self._go.set()
                continue
            _, key, op, name, version = message
            error = await self._apply(op, name, version)
            if key is not None:
                self.send(("applied", key, error))

    async def _apply(self, op: str, name: str, version: int | None) -> str | None:
        assert self._server is not None
        repository = self._server.repository
        try:
            if op == "load":
                await repository.load_model(name, version)
            elif op == "unload":
                await repository.unload_model(name, version)
            else:
                await repository.reconcile()
        except Exception as exc:
            return str(exc)
        return None

    async def relay(self, op: str, name: str, version: int | None) -> None:
        """Apply an admin change this worker made on every other worker; returns when they
        have. LoadFailedError naming the worker when one could not."""
        from textserve.service.errors import LoadFailedError

        self._next_id += 1
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        self.send(("relay", self._next_id, op, name, version))
        error = await future
        if error:
            raise LoadFailedError(error)
