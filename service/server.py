"""The server's lifecycle: startup -> serve -> drain -> shutdown, around one grpc.aio server.

`create_server(config)` builds everything and binds the port (tests pass 127.0.0.1:0 and read
the bound port); `await server.start()` serves health NOT_SERVING at once, loads and warms the
models, then marks every service SERVING; `await server.stop(grace)` drains. `serve(config)`
is the whole life of `textserve serve`, with signal handling.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from textserve.service.backlog import PENDING_CAP, Backlog, channelz_reader, server_ids
from textserve.service.config import ServerConfig
from textserve.service.dataplane.context import ServingContext, Telemetry
from textserve.service.door import Door
from textserve.service.drain import DrainGate
from textserve.service.engine.memory import pin_malloc_thresholds
from textserve.service.health import NOT_SERVING, SERVING, DrainingHealthServicer
from textserve.service.http.serving import HttpFrontEnd, http_front_end
from textserve.service.metrics import DRAINING, NO_MODEL, Metrics
from textserve.service.metrics import SERVING as READY
from textserve.service.repository.core import ModelRepository
from textserve.service.security import add_port
from textserve.service.servicers import admin, classifier, oip
from textserve.service.servicers.context import Register
from textserve.service.servicers.interceptors import GuardedRegistrar, auth_interceptors
from textserve.service.tuning import tune_for_serving
from textserve.v1 import admin_pb2

if TYPE_CHECKING:
    from textserve.service.workers.protocol import Coordinator

logger = logging.getLogger(__name__)

# The front ends served on the port: each `register(server, ctx) -> list[str]` adds its service
# and returns its full name (for health and reflection).
SERVICES: list[Register] = [
    classifier.register,
    oip.register,
    admin.register,  # adds nothing unless --enable-admin
]
# Stays SERVING while no model is served: it is how one gets loaded again.
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name


class Server:
    """One textserve server. Use on one event loop: start() then stop()."""

    def __init__(
        self,
        config: ServerConfig,
        grpc_server: grpc.aio.Server,
        port: int,
        ctx: ServingContext,
        health: DrainingHealthServicer,
        service_names: Sequence[str],
        coordinator: Coordinator | None = None,
        gate: DrainGate | None = None,
        backlog: Backlog | None = None,
    ) -> None:
        self.config = config
        self.grpc_server = grpc_server
        self.port = port
        self.ctx = ctx
        self.repository = ctx.repository
        self.metrics = ctx.metrics
        self.health = health
        self.service_names = list(service_names)
        self.http: HttpFrontEnd | None = None  # the HTTP port (service/http/), when on
        self.metrics_port: int | None = None  # the HTTP port, bound (--http-port)
        self._reuse_port = False  # --workers: the HTTP port is shared too (SO_REUSEPORT)
        self._stopping = False
        self.gate = gate or DrainGate()  # the drain's first step (service/drain.py)
        # the calls grpc holds for the event loop, refused once too old (service/backlog.py)
        self.backlog = backlog or Backlog(None)
        # --workers: the link to the supervisor, awaited before SERVING (it says when every
        # worker is warm) and told each readiness state (the supervisor's /readyz)
        self.coordinator = coordinator

    def peer_lost(self) -> None:
        """Another worker died: its clients' calls, arriving here, are not overload for a
        while (service/backlog.py, service/door.py)."""
        self.backlog.peer_lost()
        if self.ctx.door is not None:
            self.ctx.door.peer_lost()

    @property
    def address(self) -> str:
        return f"{self.config.listen.rpartition(':')[0]}:{self.port}"

    async def start(self) -> None:
        """startup: listen (health NOT_SERVING), load and warm every model, then SERVING.
        Raises (after cleaning up) when the models cannot be served."""
        await self._set_health(NOT_SERVING)  # until the models are loaded and warm
        if self.coordinator is None:  # one server: it answers health while it loads
            await self._listen()
        if self.config.metrics_port is not None:
            # before the models load: /readyz says "warming" meanwhile
            self.http = await http_front_end(self.ctx, reuse_port=self._reuse_port)
            self.metrics_port = self.http.port
        try:
            await self.repository.load_all()
            if self.coordinator is not None:
                # One of --workers N listens only once warm: the connections the kernel hands a
                # worker that restarts would otherwise fail while it loads, as the others serve.
                await self._listen()
                await self.coordinator.before_serving()
        except BaseException:
            await self._close(grace=0)
            raise
        await self._set_health(SERVING)
        self._set_readiness(READY)
        self.repository.on_change = self._models_changed
        logger.info(
            "textserve: serving %s on %s (default model: %s)",
            ", ".join(f"{h.name}:{h.version} [{h.provider}]" for h in self.repository.handles()),
            self.address,
            self.repository.default_model or "none",
        )

    async def _listen(self) -> None:
        await self.grpc_server.start()
        self.backlog.start(asyncio.get_running_loop())
        if self.ctx.door is not None:
            self.ctx.door.start(asyncio.get_running_loop())
        if self.coordinator is None:
            logger.info(
                "listening on %s (gRPC); loading models from %s",
                self.address,
                self.config.repository,
            )
        else:  # the supervisor said where it listens; this worker's models are warm
            logger.info("listening on %s (gRPC)", self.address)

    async def _models_changed(self, serving: bool) -> None:
        """While no model is served (an admin unloaded them all, the last version folder was
        removed), the server and its model services report NOT_SERVING; the Admin service,
        through which a model is loaded again, stays SERVING."""
        await self._set_health(SERVING if serving else NOT_SERVING, but=ADMIN_SERVICE)
        self._set_readiness(READY if serving else NO_MODEL)

    def _set_readiness(self, state: str) -> None:
        """What the metrics port's /readyz says: the state grpc.health.v1 reports for ""."""
        if self._stopping and state != DRAINING:
            return
        if self.http is not None:
            self.http.app.set_readiness(state)
        if self.coordinator is not None:
            self.coordinator.on_readiness(state)

    async def _set_health(self, status: int, *, but: str | None = None) -> None:
        """`status` for the server ("") and every service it registered, except `but`."""
        for name in ("", *self.service_names):
            if name != but:
                await self.health.set(name, status)

    async def stop(self, grace: float | None = None) -> None:
        """drain + shutdown: health NOT_SERVING, GOAWAY to every connection, let queued,
        in-flight and held requests finish within `grace` seconds (default: the config's),
        cancel the rest. The order is service/drain.py's."""
        if self._stopping:
            return
        self._stopping = True
        grace = self.config.grace_period if grace is None else grace
        started = time.monotonic()
        deadline = started + grace
        logger.info("draining (grace period %.1fs)", grace)
        self._set_readiness(DRAINING)
        self.gate.close()  # from now on a new call waits at the gate: neither run nor cancelled
        await self.health.enter_graceful_shutdown()  # health-checking balancers look elsewhere
        self.repository.flush()  # queued batches start now instead of waiting to fill
        if not await self.gate.settled(deadline):
            # Callers that do not wait for answers (open loop) never went quiet: a call of
            # theirs reaching grpc as its shutdown begins would be CANCELLED. The held calls
            # run; new ones are refused (UNAVAILABLE, retryable) until the callers stop.
            self.gate.refuse_new()
            await self.gate.quiet(deadline)
        left = max(0.0, deadline - time.monotonic())
        stopping = asyncio.ensure_future(self.grpc_server.stop(left))
        await asyncio.sleep(0)  # its first step: listener closed, GOAWAY sent to every client
        self.gate.release(serve=left > 0)  # the held calls run; their callers go elsewhere next
        await self._close(left, stopping)
        logger.info(
            "stopped after %.2fs (%d call(s) held at the drain's gate, %d refused)",
            time.monotonic() - started, self.gate.held, self.gate.refused,
        )  # fmt: skip

    async def _close(self, grace: float, grpc_stopping: Awaitable[None] | None = None) -> None:
        # grpc (its stop() begun by the drain, else here) refuses new calls at once and cancels
        # those still running when grace is over; HTTP answers new inference requests 503 while
        # its in-flight ones finish
        self.backlog.stop()  # before grpc's server is gone: its counts with it
        if self.ctx.door is not None:
            self.ctx.door.stop()
        http = None if self.http is None else self.http.server
        draining = [grpc_stopping or self.grpc_server.stop(grace)]
        if http is not None:
            draining.append(http.drain(grace))
        await asyncio.gather(*draining)
        await self.repository.close(timeout=0)
        if http is not None:  # the probes answer (draining) until everything above is done
            await http.close()
        tracing = self.ctx.telemetry.tracing
        if tracing is not None:  # the last spans, within SHUTDOWN_TIMEOUT
            await asyncio.to_thread(tracing.shutdown)


def _grpc_options(config: ServerConfig, reuse_port: bool) -> list[tuple[str, Any]]:
    """The grpc server's channel arguments."""
    limit, age = config.max_streams_per_connection, config.max_connection_age
    return [
        # A larger request gets RESOURCE_EXHAUSTED from grpc before it is read whole.
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        # one process: a port in use is an error, not a shared listener
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        # The calls grpc core holds until the event loop takes them: past 1,000 (its
        # default) grpc cancels arriving calls, CANCELLED, which nobody retries. Here a
        # memory bound it does not reach: the backlog is refused by age first (backlog.py).
        ("grpc.server.max_pending_requests", PENDING_CAP),
        ("grpc.server.max_pending_requests_hard_limit", PENDING_CAP),
        # ... and a few connections cannot fill it: a client holds its calls past this
        # many open on one connection (HTTP/2 max concurrent streams).
        *([] if limit is None else [("grpc.max_concurrent_streams", limit)]),
        # GOAWAY after a connection's age, so that clients reconnect (config.py). No grace:
        # its calls in flight run to their end (an endless ClassifyStream included).
        *([] if age is None else [("grpc.max_connection_age_ms", int(age * 1e3))]),
    ]


def create_server(
    config: ServerConfig,
    *,
    metrics: Metrics | None = None,
    extra_services: Sequence[Register] = (),
    reuse_port: bool = False,
    coordinator: Coordinator | None = None,
) -> tuple[Server, int]:
    """Build the server and bind its port; call inside the event loop that will run it.

    `extra_services` are register functions added after those of SERVICES (tests, plugins).
    `reuse_port`: share the port with the other workers of `--workers N` (SO_REUSEPORT; the
    supervisor holds it, so that another program on it is still an error).
    `coordinator`: this server is one worker of `--workers N` (textserve.service.workers):
    its health answers name the worker, admin changes are relayed to the others, SERVING waits
    for the supervisor.
    """
    metrics = metrics or Metrics()
    repository = ModelRepository.from_server(config, metrics)
    ctx = ServingContext(
        config=config,
        repository=repository,
        metrics=metrics,
        telemetry=telemetry(config, metrics),
        relay=coordinator.relay if coordinator is not None else None,
    )
    gate = DrainGate(metrics)
    before = server_ids()  # grpc's counts of this server are channelz's new one (backlog.py)
    grpc_server = grpc.aio.server(
        # authentication only (when on): a refused call is neither parsed nor served. The
        # drain's gate and the decode guard sit on each method handler (GuardedRegistrar):
        # an interceptor would cost every call a coroutine and a continuation.
        interceptors=auth_interceptors(config.security),
        maximum_concurrent_rpcs=config.max_concurrent_rpcs,
        options=_grpc_options(config, reuse_port),
    )
    backlog = Backlog(
        config.max_backlog_wait,
        channelz_reader(before) if config.max_backlog_wait is not None else None,
        target=config.backlog_target,
        counter=metrics.backlog_refusals,
        unhandled=metrics.grpc_unhandled,
    )
    ctx.door = Door(
        config.max_concurrent_rpcs,
        config.inflight_wait,
        gauge=metrics.inflight_limit,
        refusals=metrics.limit_refusals,
        extra_arrivals=lambda: backlog.unhandled,  # refused by grpc.aio's limiter
    )
    # a grpc.aio.Server to the services
    registrar: Any = GuardedRegistrar(grpc_server, gate, backlog, ctx.door)
    names: list[str] = []
    for register in [*SERVICES, *extra_services]:
        names.extend(register(registrar, ctx))
    health = DrainingHealthServicer()
    if coordinator is not None:
        health.worker, health.workers = coordinator.worker_id, coordinator.workers
    health_pb2_grpc.add_HealthServicer_to_server(health, registrar)
    health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
    reflection.enable_server_reflection([*names, health_name, reflection.SERVICE_NAME], registrar)
    try:
        port = add_port(grpc_server, config.listen, config.security)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {config.listen}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot listen on {config.listen} (in use, or not an address of this host)")
    server = Server(config, grpc_server, port, ctx, health, names, coordinator, gate, backlog)
    server._reuse_port = reuse_port
    return server, port


def telemetry(config: ServerConfig, metrics: Metrics) -> Telemetry:
    """Tracing and the access log as configured (each None when off; tracing off never
    imports opentelemetry)."""
    tracing = None
    if config.otlp_endpoint is not None:
        from textserve.service.tracing import Tracing

        tracing = Tracing(config.otlp_endpoint, config.trace_sample_ratio, metrics=metrics)
        logger.info(
            "tracing: OTLP to %s, %g of new traces sampled",
            config.otlp_endpoint,
            config.trace_sample_ratio,
        )
    access_log = None
    if config.access_log == "json":
        from textserve.service.access_log import AccessLog

        access_log = AccessLog(
            rate=config.access_log_rate, log_texts=config.log_texts, metrics=metrics
        )
    return Telemetry(tracing=tracing, access_log=access_log)


async def serve(
    config: ServerConfig,
    on_ready: Callable[[Server], None] | None = None,
    *,
    coordinator: Coordinator | None = None,
) -> int:
    """The life of `textserve serve`: start, serve until SIGTERM/SIGINT, drain, exit status.
    `coordinator`: this process is one worker of `--workers N`, linked to its supervisor."""
    # Before any model loads: a retired version's memory can then go back (engine/memory.py).
    pin_malloc_thresholds()
    server, _ = create_server(config, reuse_port=coordinator is not None, coordinator=coordinator)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGTERM: what orchestrators (Kubernetes, systemd, docker stop) send to ask for a drain.
    # SIGINT: Ctrl-C in a terminal; a second one stops at once without waiting for the grace.
    signals = (signal.SIGTERM, signal.SIGINT)

    def on_signal(signum: int) -> None:
        if stop.is_set():
            logger.warning("second %s: stopping without grace", signal.Signals(signum).name)
            forced_by.append(signum)
            force.set()
            return
        logger.info("%s received: draining", signal.Signals(signum).name)
        stop.set()

    force = asyncio.Event()
    forced_by: list[int] = []
    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    if coordinator is not None:  # the supervisor went away: drain as on SIGTERM
        coordinator.attach(server.repository, lambda: on_signal(signal.SIGTERM), server.peer_lost)
    try:
        start = asyncio.create_task(server.start())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({start, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not start.done():  # a signal during startup: give up loading
            start.cancel()
            await asyncio.gather(start, return_exceptions=True)
            await server.stop(0)
            return 0
        start.result()  # raises when startup failed
        tune_for_serving()  # GC and thread settings, now that the models are loaded
        if on_ready is not None:
            on_ready(server)
        await stopped
        drain = asyncio.create_task(server.stop())
        forced = asyncio.create_task(force.wait())
        await asyncio.wait({drain, forced}, return_when=asyncio.FIRST_COMPLETED)
        if not drain.done():
            if server.http is not None:
                server.http.server.hurry()
            await server.grpc_server.stop(0)
            await drain
        forced.cancel()
        # Cut short, in-flight requests may have been cancelled: say so with the status a shell
        # gives a process killed by that signal.
        return 128 + forced_by[0] if forced_by else 0
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
