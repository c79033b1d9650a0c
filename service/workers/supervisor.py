"""`textserve serve --workers N`: a small supervisor and N worker processes on one port.

Shaped after grpc's examples/python/multiprocessing/server.py and gunicorn's arbiter:

- The supervisor reserves the port with a SO_REUSEPORT socket it binds and never listens on
  (so another program on the port is still an error, and port 0 picks one), then starts the
  workers (spawned: a fresh interpreter each, no gRPC or onnxruntime state forked, grpc issue
  #16001). Each worker (worker.py here) is a whole server serving that address with
  `grpc.so_reuseport` on; the kernel spreads *connections* over them.
- Readiness: every worker loads and warms its models, says Warm and waits; when all are
  warm the supervisor tells them to Serve (grpc.health.v1 is served by each worker,
  the supervisor serves no gRPC). /readyz (the supervisor's) answers 200 only while every
  worker serves.
- SIGTERM/SIGINT are forwarded to every worker, which drains as a single server does; a
  second signal is forwarded too (stop without grace). The supervisor exits when all have.
- A worker that dies is restarted after a backoff (0.5 s doubling to 10 s;
  textserve_worker_restarts_total); CRASH_LIMIT deaths within CRASH_WINDOW seconds stop the
  server with status 1. A worker that fails before the server ever served stops it with the
  worker's error (one line, status 2), as a single process would.
- One /metrics: prometheus-client's multiprocess mode, a fresh PROMETHEUS_MULTIPROC_DIR
  created here and removed at exit (metrics.server_registry here).
- Admin changes are relayed to every worker (protocol.py says why) and replayed to a worker
  that restarts.
The messages over each worker's pipe are the typed ones of protocol.py; each worker's state,
restart backoff and heartbeat decisions are lifecycle.py's (pure): this module does the I/O.
One log line per worker state change: "worker 2 (pid 123): warm".
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from textserve.service.config import ServerConfig
from textserve.service.workers.errors import SupervisorError
from textserve.service.workers.lifecycle import (
    CRASH_WINDOW,
    WARM,
    Beat,
    CrashWindow,
    IllegalTransition,
    Lifecycle,
    server_readiness,
)
from textserve.service.workers.metrics import create_metrics_dir, mark_dead
from textserve.service.workers.protocol import (
    AdminChange,
    Applied,
    Apply,
    PeerLost,
    Ping,
    Pong,
    Readiness,
    Relay,
    Relayed,
    RelayKey,
    Serve,
    StartupFailed,
    ToSupervisor,
    ToWorker,
    Warm,
)
from textserve.service.workers.sizing import worker_config
from textserve.service.workers.worker import WorkerSpec, worker_main

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def reserve_port(listen: str) -> Iterator[int]:
    """Bind HOST:PORT with SO_REUSEPORT and hold it (never listening: the kernel gives
    connections to listening sockets only); yields the port (port 0: the one picked). OSError
    when another program has the port."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    infos = socket.getaddrinfo(
        host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise OSError(f"cannot listen on {listen} ({exc.strerror})") from None
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


# -- the supervisor -----------------------------------------------------------------------------


@dataclass
class _Worker:
    """One worker slot: its process and pipe (the I/O) and its life (lifecycle.py)."""

    index: int
    process: BaseProcess | None = None
    conn: Connection | None = None
    pid: int = 0
    seen: int = 0  # entries of the admin log this worker has applied (or will, at startup)
    life: Lifecycle = field(default_factory=Lifecycle)


@dataclass
class _Relay:
    origin: _Worker
    key: RelayKey
    waiting: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)


class Supervisor:
    def __init__(self, config: ServerConfig, workers: int, log_level: str = "INFO") -> None:
        self.config = config
        self.count = workers
        self.log_level = log_level
        self.workers = [_Worker(i + 1) for i in range(workers)]
        self.admin_log: list[AdminChange] = []
        self._relays: dict[RelayKey, _Relay] = {}
        self._context = multiprocessing.get_context("spawn")
        self._deaths = CrashWindow()
        self._stopping: int | None = None  # the signal that started the drain
        self._stop_deadline = 0.0
        self._announced = False
        self._started = False  # every worker was warm once
        self._fatal: SupervisorError | None = None
        self._codes: list[int] = []
        self._metrics: Any = None
        self._metrics_server: Any = None
        self._hub: Any = None  # --engine shared: engine/hub.py's HubProcess
        self.address = ""
        self.metrics_port: int | None = None
        # Liveness: a Ping this often; a worker past its startup that has said nothing for
        # worker_timeout seconds is killed and restarted (gunicorn's worker timeout).
        self._ping_interval = min(1.0, config.worker_timeout / 4)

    # -- the life of the server -----------------------------------------------------------

    def run(self, on_ready: Callable[[Supervisor], None] | None = None) -> int:
        """Serve until SIGTERM/SIGINT; the exit status (SupervisorError when it never served
        or its workers crash-loop)."""
        self.on_ready = on_ready
        directory = create_metrics_dir()
        wake_r, wake_w = socket.socketpair()
        wake_w.setblocking(False)
        previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)}
        old_fd = signal.set_wakeup_fd(wake_w.fileno())
        try:
            with reserve_port(self.config.listen) as port, self._http_port() as http_port:
                self.metrics_dir = directory
                private = self._start_metrics(directory)
                http = None if http_port is None or private is None else (http_port, private)
                self.worker_config = self._start_hub(
                    worker_config(self.config, port, self.count, http)
                )
                self.address = self.worker_config.listen
                logger.info(
                    "listening on %s (gRPC) with %d workers (%d onnxruntime threads each); "
                    "loading models from %s",
                    self.address, self.count, self.worker_config.runtime.intra_op_threads,
                    self.config.repository,
                )  # fmt: skip
                for worker in self.workers:
                    self._spawn(worker)
                self._loop(wake_r)
        finally:
            signal.set_wakeup_fd(old_fd)
            for s, handler in previous.items():
                signal.signal(s, handler)
            wake_r.close()
            wake_w.close()
            if self._metrics_server is not None:
                self._metrics_server.close()
            if self._hub is not None:
                self._hub.stop()
            shutil.rmtree(directory, ignore_errors=True)
        if self._fatal is not None:
            raise self._fatal
        forced = [c for c in self._codes if c > 128]
        failed = [c for c in self._codes if c > 0]
        return (forced or failed or [0])[0]

    @contextlib.contextmanager
    def _http_port(self) -> Iterator[int | None]:
        """The HTTP port, held like the gRPC one while the workers serve it (None: off)."""
        if self.config.metrics_port is None:
            yield None
            return
        with reserve_port(f"{self.config.metrics_host}:{self.config.metrics_port}") as port:
            self.metrics_port = port
            yield port

    def _start_metrics(self, directory: str) -> int | None:
        """The supervisor's /metrics (every worker summed) and /readyz (all workers warm) on a
        private loopback port, which each worker's HTTP port answers those two paths with;
        returns that port (None: no HTTP port)."""
        if self.config.metrics_port is None:
            return None
        from textserve.service.metrics import start_metrics_server
        from textserve.service.workers.metrics import SupervisorMetrics, server_registry

        registry = server_registry(directory, self._live_pids)
        self._metrics = SupervisorMetrics(registry)
        self._metrics_server, private = start_metrics_server(0, "127.0.0.1", registry)
        logger.info(
            "metrics on http://%s:%d/metrics (every worker's HTTP port)",
            self.config.metrics_host, self.metrics_port,
        )  # fmt: skip
        return int(private)

    def _start_hub(self, config: ServerConfig) -> ServerConfig:
        """--engine shared: start the one engine process every worker sends its batches to,
        with the whole machine's onnxruntime threads, and tell the workers where it is."""
        if config.runtime.engine != "shared":
            return config
        from textserve.service.engine.hub import HubProcess

        batcher = self.config.batcher
        limit = batcher.max_batch_size * self.count  # one batch from each worker at most
        self._hub = HubProcess(self.config.runtime, batcher.max_batch_tokens, limit, self.log_level)
        try:
            self._hub.start()
        except Exception as exc:
            raise SupervisorError(f"--engine shared: {exc}", 1) from None
        runtime = replace(
            config.runtime, engine_hub=self._hub.address, engine_hub_key=self._hub.authkey.hex()
        )
        return replace(config, runtime=runtime)

    def _watch_hub(self) -> None:
        """A shared engine that died is started again; each worker's next batch reconnects."""
        if self._hub is None or self._stopping is not None or self._hub.alive():
            return
        try:
            self._hub.restart()
        except Exception as exc:
            self._fatal = SupervisorError(f"--engine shared: {exc}", 1)
            self._stop(signal.SIGTERM)

    def _live_pids(self) -> list[int]:
        return [w.pid for w in self.workers if w.process is not None and w.pid]

    def _loop(self, wake: socket.socket) -> None:
        while True:
            running = [w for w in self.workers if w.process is not None]
            if self._stopping is not None and not running:
                return
            now = time.monotonic()
            timeout = self._ping_interval
            for w in self.workers:
                if w.life.restart_at is not None:
                    timeout = min(timeout, max(0.0, w.life.restart_at - now))
            waitables: list[Any] = [wake]
            if self._hub is not None and self._hub.alive():
                waitables.append(self._hub.sentinel)
            for w in running:
                assert w.process is not None
                waitables.append(w.process.sentinel)
                if w.conn is not None:
                    waitables.append(w.conn)
            for ready in wait(waitables, timeout):
                if ready is wake:
                    for signum in wake.recv(64):
                        self._signal(signum)
                    continue
                for w in running:
                    if ready is w.conn:
                        self._receive(w)
            for w in running:  # after reading what it said before it went
                assert w.process is not None
                if not w.process.is_alive():
                    self._exited(w)
            self._watch_hub()
            self._restart_due()
            if self._stopping is None:
                self._heartbeat(time.monotonic())
            if self._stopping is not None and time.monotonic() > self._stop_deadline:
                for w in self.workers:
                    if w.process is not None and w.process.is_alive():
                        logger.warning(
                            "worker %d (pid %d): killed, not stopped in time", w.index, w.pid
                        )
                        w.process.kill()
                self._stop_deadline = float("inf")

    def _spawn(self, worker: _Worker) -> None:
        parent, child = self._context.Pipe()
        spec = WorkerSpec(
            index=worker.index,
            workers=len(self.workers),
            config=self.worker_config,
            metrics_dir=self.metrics_dir,
            log_level=self.log_level,
            replay=tuple(self.admin_log),
        )
        process = self._context.Process(
            target=worker_main, args=(spec, child), name=f"textserve-worker-{worker.index}"
        )
        process.start()
        child.close()
        worker.process, worker.conn, worker.pid = process, parent, process.pid or 0
        worker.seen = len(self.admin_log)
        worker.life.spawned(time.monotonic())
        self._set_count()
        logger.info("worker %d (pid %d): %s", worker.index, worker.pid, worker.life.text)

    def _set_count(self) -> None:
        if self._metrics is not None:
            self._metrics.workers.set(len(self._live_pids()))

    # -- what workers say -----------------------------------------------------------------

    def _receive(self, worker: _Worker) -> None:
        assert worker.conn is not None
        try:
            while worker.conn.poll():
                worker.life.heard(time.monotonic())
                self._message(worker, worker.conn.recv())
        except (EOFError, OSError):
            worker.conn.close()
            worker.conn = None  # the process is ending: its sentinel tells the rest

    def _message(self, worker: _Worker, message: ToSupervisor) -> None:
        try:
            self._dispatch(worker, message)
        except IllegalTransition as exc:  # another process's word: said, not fatal here
            logger.warning("worker %d: %r out of turn: %s", worker.index, message, exc)

    def _dispatch(self, worker: _Worker, message: ToSupervisor) -> None:
        match message:
            case Warm():
                self._warm(worker)
            case Readiness(state=state):
                if worker.life.reported(state):
                    self._changed(worker)
            case StartupFailed(message=failure):
                worker.life.startup_failed(failure)
            case Relay(ident=ident, change=change):
                self._relay(worker, RelayKey(worker.index, ident), change)
            case Applied(key=key, error=error):
                self._applied(worker, key, error)
            case Pong():
                pass  # heard_at is all it tells
            case _:
                logger.warning("worker %d: unknown message %r", worker.index, message)

    def _warm(self, worker: _Worker) -> None:
        worker.life.warm()
        self._changed(worker)
        if self._stopping is not None:
            return
        if self._started:
            self._catch_up(worker)
        elif all(w.life.state is WARM for w in self.workers):
            self._started = True
            for w in self.workers:
                self._catch_up(w)

    def _catch_up(self, worker: _Worker) -> None:
        """Send what an admin changed since the worker started, then let it serve."""
        for change in self.admin_log[worker.seen :]:
            self._send(worker, Apply(None, change))
        worker.seen = len(self.admin_log)
        self._send(worker, Serve())

    def _send(self, worker: _Worker, message: ToWorker) -> None:
        if worker.conn is not None:
            with contextlib.suppress(OSError):  # it is dying: its sentinel tells
                worker.conn.send(message)

    def _changed(self, worker: _Worker) -> None:
        """The worker's state changed: one log line, and the server's readiness follows."""
        logger.info("worker %d (pid %d): %s", worker.index, worker.pid, worker.life.text)
        self._readiness()

    def _readiness(self) -> None:
        from textserve.service.metrics import SERVING

        ready = server_readiness((w.life.state for w in self.workers), self._stopping is not None)
        if self._metrics_server is not None:
            self._metrics_server.set_state(ready)
        if ready == SERVING and not self._announced:
            self._announced = True
            logger.info("textserve: %d workers serving on %s", self.count, self.address)
            if self.on_ready is not None:
                self.on_ready(self)

    def _relay(self, origin: _Worker, key: RelayKey, change: AdminChange) -> None:
        if change.replayed:
            self.admin_log.append(change)
            origin.seen += 1
        relay = _Relay(origin, key)
        for w in self.workers:
            # a worker still starting gets the change from the log when it is warm
            if w is origin or w.conn is None or w.life.catches_up:
                continue
            relay.waiting.add(w.index)
            self._send(w, Apply(key, change))
            if change.replayed:
                w.seen += 1
        self._relays[key] = relay
        self._finish_relay(relay)

    def _applied(self, worker: _Worker, key: RelayKey, error: str | None) -> None:
        relay = self._relays.get(key)
        if relay is None:
            return
        relay.waiting.discard(worker.index)
        if error:
            relay.errors.append(f"worker {worker.index}: {error}")
        self._finish_relay(relay)

    def _finish_relay(self, relay: _Relay) -> None:
        if relay.waiting:
            return
        self._relays.pop(relay.key, None)
        self._send(relay.origin, Relayed(relay.key.ident, "; ".join(relay.errors) or None))

    # -- deaths, restarts, signals --------------------------------------------------------

    def _exited(self, worker: _Worker) -> None:
        assert worker.process is not None
        worker.process.join()
        code = worker.process.exitcode or 0
        if worker.conn is not None:
            self._receive(worker)  # its last words ("failed")
        if worker.conn is not None:
            worker.conn.close()
        mark_dead(worker.pid, self.metrics_dir)
        worker.process, worker.conn = None, None
        for relay in list(self._relays.values()):  # it will get the change again if restarted
            if worker.index in relay.waiting:
                relay.waiting.discard(worker.index)
                self._finish_relay(relay)
        life = worker.life
        if self._stopping is not None:
            self._codes.append(code)
            life.stopped(code)
        elif not self._started:
            life.failed(code)
            logger.error("worker %d (pid %d): %s", worker.index, worker.pid, life.text)
            self._fatal = SupervisorError(
                life.failure or f"worker {worker.index} exited with {life.how} before it was ready",
                2 if life.failure else 1,
            )
            self._stop(signal.SIGTERM)
            return
        elif self._deaths.record(now := time.monotonic()):
            self._crash_loop(worker, code)
            return
        else:
            life.died(code, now)
            for other in self.workers:  # its clients reconnect to them
                if other is not worker and other.conn is not None:
                    self._send(other, PeerLost())
        self._changed(worker)
        worker.pid = 0
        self._set_count()

    def _crash_loop(self, worker: _Worker, code: int) -> None:
        """CRASH_LIMIT deaths within CRASH_WINDOW seconds, this one the last: stop the server."""
        worker.life.failed(code)
        deaths = len(self._deaths.deaths)
        logger.error(
            "worker %d (pid %d): died with %s: %d worker deaths within %.0fs, stopping",
            worker.index, worker.pid, worker.life.how, deaths, CRASH_WINDOW,
        )  # fmt: skip
        self._fatal = SupervisorError(
            f"workers keep dying ({deaths} deaths within {CRASH_WINDOW:.0f}s; "
            f"the last: {worker.life.failure or worker.life.how})",
            1,
        )
        self._stop(signal.SIGTERM)

    def _heartbeat(self, now: float) -> None:
        """Ping every worker that is past its startup and kill one that has said nothing for
        worker_timeout seconds (Lifecycle.heartbeat decides): stopped, or its event loop
        blocked (the Pong is sent from the loop). Readiness goes 503 at once; the restart
        follows the usual backoff."""
        timeout = self.config.worker_timeout
        for w in self.workers:
            if w.process is None or w.conn is None:
                continue
            beat = w.life.heartbeat(now, timeout, self._ping_interval)
            if beat is Beat.KILL:
                logger.warning(
                    "worker %d (pid %d): unresponsive (no answer for %.1fs, --worker-timeout "
                    "%gs): killed",
                    w.index, w.pid, w.life.silence(now), timeout,
                )  # fmt: skip
                w.life.killed_unresponsive()
                self._changed(w)
                w.process.kill()  # SIGKILL: also ends a stopped (SIGSTOP) process
            elif beat is Beat.PING:
                self._send(w, Ping(w.life.pinged(now)))

    def _restart_due(self) -> None:
        now = time.monotonic()
        for worker in self.workers:
            if worker.life.restart_due(now):
                if self._stopping is not None:
                    worker.life.restart_cancelled()
                    continue
                if self._metrics is not None:
                    self._metrics.worker_restarts.labels(worker.life.restart_reason).inc()
                self._spawn(worker)

    def _signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._stopping is None:
            logger.info("%s received: draining %d workers", name, len(self._live_pids()))
        else:
            logger.warning("second %s: forwarded, workers stop without grace", name)
        self._stop(signum)

    def _stop(self, signum: int) -> None:
        if self._stopping is None:
            self._stopping = signum
            self._stop_deadline = time.monotonic() + self.config.grace_period + 15.0
            self._readiness()
        for worker in self.workers:
            if worker.life.restart_at is not None:
                worker.life.restart_cancelled()
            if worker.process is not None and worker.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signum)


def serve_workers(
    config: ServerConfig,
    workers: int,
    log_level: str = "INFO",
    on_ready: Callable[[Supervisor], None] | None = None,
) -> int:
    """The life of `textserve serve --workers N` (N > 1)."""
    return Supervisor(config, workers, log_level).run(on_ready)
