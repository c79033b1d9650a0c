"""One worker process of `textserve serve --workers N`: a whole server (sessions, batcher,
watcher, gRPC on the shared port) linked to its supervisor by a pipe; the messages are those
of textserve.service.workers.protocol.

    worker_main(spec, conn)       # the target of the supervisor's spawned process
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from textserve.service.config import ServerConfig
from textserve.service.workers.protocol import (
    AdminAction,
    AdminChange,
    Applied,
    Apply,
    Hook,
    PeerLost,
    Ping,
    Pong,
    Readiness,
    Relay,
    Relayed,
    Serve,
    StartupFailed,
    ToSupervisor,
    ToWorker,
    Warm,
)

if TYPE_CHECKING:
    from textserve.service.repository.core import ModelRepository

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSpec:
    index: int  # 1..N, stays the same across restarts
    workers: int  # N
    config: ServerConfig  # the listen address with the port the supervisor reserved
    metrics_dir: str  # PROMETHEUS_MULTIPROC_DIR
    log_level: str
    replay: tuple[AdminChange, ...] = ()  # admin changes made before this worker started


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Serve until SIGTERM/SIGINT (forwarded by the supervisor) or until the supervisor goes
    away; exits with serve()'s status, or 2 after telling the supervisor why startup failed."""
    # A terminal's Ctrl-C goes to the supervisor only; it forwards it (once per press).
    os.setpgrp()
    from textserve.service.workers.metrics import use_multiprocess_files

    use_multiprocess_files(spec.metrics_dir)  # before any metric exists
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
        code = asyncio.run(serve(spec.config, coordinator=link))
    except (StartupError, DeviceUnavailableError, OSError, ConfigError) as exc:
        link.send(StartupFailed(str(exc)))
        sys.exit(2)
    sys.exit(code)


class WorkerLink:
    """This worker's end of the pipe: the Coordinator its server is built with (serve()
    attaches it to the running server)."""

    def __init__(self, spec: WorkerSpec, conn: Connection) -> None:
        self.spec = spec
        self.worker_id = f"{spec.index}/{os.getpid()}"
        self._conn = conn
        self._repository: ModelRepository | None = None
        self._pending: dict[int, asyncio.Future[str | None]] = {}
        self._next_id = 0
        self._inbox: asyncio.Queue[Serve | Apply] = asyncio.Queue()
        self._go = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stop: Hook | None = None
        self._peer_lost: Hook | None = None

    @property
    def workers(self) -> int:
        return self.spec.workers

    def send(self, message: ToSupervisor) -> None:
        with contextlib.suppress(OSError, ValueError):  # the supervisor is gone: reader notices
            self._conn.send(message)

    def attach(self, repository: ModelRepository, stop: Hook, peer_lost: Hook) -> None:
        """Start listening to the supervisor: admin changes apply to `repository`; `stop()`
        drains the server (called when the supervisor is gone); `peer_lost()` when another
        worker died."""
        self._repository = repository
        self._stop, self._peer_lost = stop, peer_lost
        loop = asyncio.get_running_loop()
        loop.add_reader(self._conn.fileno(), self._readable)
        self._tasks.append(loop.create_task(self._apply_in_order()))

    # -- Coordinator --------------------------------------------------------------------------

    async def before_serving(self) -> None:
        for change in self.spec.replay:  # what an admin changed before this worker (re)started
            if error := await self._apply(change):
                logger.warning(
                    "replaying admin %s %s: %s", change.action.value, change.model, error
                )
        self.send(Warm())
        await self._go.wait()  # the supervisor says when every worker is warm

    def on_readiness(self, state: str) -> None:
        self.send(Readiness(state))

    async def relay(self, change: AdminChange) -> None:
        """Apply an admin change this worker made on every other worker; returns when they
        have. LoadFailedError naming the worker when one could not."""
        from textserve.service.errors import LoadFailedError

        self._next_id += 1
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        self.send(Relay(self._next_id, change))
        error = await future
        if error:
            raise LoadFailedError(error)

    # -- what the supervisor says -------------------------------------------------------------

    def _readable(self) -> None:
        try:
            while self._conn.poll():
                self._message(self._conn.recv())
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(self._conn.fileno())
            for future in self._pending.values():
                if not future.done():
                    future.set_result("the supervisor is gone")
            logger.warning("the supervisor is gone: draining")
            if self._stop is not None:
                self._stop()

    def _message(self, message: ToWorker) -> None:
        match message:
            case Relayed(ident=ident, error=error):
                future = self._pending.pop(ident, None)
                if future is not None and not future.done():
                    future.set_result(error)
            case Ping(seq=seq):  # from the event loop: a blocked loop does not answer
                self.send(Pong(seq))
            case PeerLost():
                logger.info("another worker died: its clients come here too")
                if self._peer_lost is not None:  # attached
                    self._peer_lost()
            case Serve() | Apply():  # in the order they came
                self._inbox.put_nowait(message)
            case _:
                logger.warning("unknown message from the supervisor: %r", message)

    async def _apply_in_order(self) -> None:
        while True:
            message = await self._inbox.get()
            match message:
                case Serve():
                    self._go.set()
                case Apply(key=key, change=change):
                    error = await self._apply(change)
                    if key is not None:
                        self.send(Applied(key, error))

    async def _apply(self, change: AdminChange) -> str | None:
        repository = self._repository
        assert repository is not None
        try:
            match change.action:
                case AdminAction.LOAD:
                    await repository.load_model(change.model, change.version)
                case AdminAction.UNLOAD:
                    await repository.unload_model(change.model, change.version)
                case AdminAction.RELOAD:
                    await repository.reconcile()
        except Exception as exc:
            return str(exc)
        return None
