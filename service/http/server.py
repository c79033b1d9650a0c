"""The HTTP server: uvicorn's httptools protocol on the serving process's own event loop (the
one grpc.aio runs on), bounded against slow and hostile clients.

    http = HttpServer(app, HttpConfig(), "0.0.0.0", 8000, security)
    port = await http.start()        # binds (SO_REUSEPORT with --workers), serves
    await http.drain(grace=30)       # new inference requests 503, in-flight ones finish
    await http.close()               # then stop accepting and close the connections

Why uvicorn + httptools with a bare ASGI app: measured on the real routes beside a grpc.aio
server in the same loop (docs/http.md, "Choosing the server"), it took the least server CPU
per request of the asyncio servers that run in-loop (aiohttp's handler stack costs more per
request; granian's in-loop mode is experimental; Starlette adds its own routing on top).

uvicorn bounds idle keep-alive connections but not a request that never completes, nor how
many connections it holds. `_BoundedProtocol` adds both: a connection must finish its request
line and headers within `header_timeout` seconds (and keep them under `max_header_bytes`), its
body within `body_timeout` seconds, or it is closed; past `max_connections` a new connection is
closed at once. No thread per connection, so 1,000 slowloris connections cost a few MB and no
threads, and the probes keep answering.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

if TYPE_CHECKING:
    from textserve.service.config import SecurityConfig
    from textserve.service.http.app import HttpApp

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Bounds:
    """What one connection may hold of the server (ServerConfig.http's values)."""

    header_timeout: float = 10.0  # seconds from a request's first byte to its last header
    body_timeout: float = 30.0  # seconds from the last header to the last byte of the body
    keep_alive: float = 5.0  # seconds an idle keep-alive connection stays open
    max_header_bytes: int = 64 * 1024  # request line and headers of one request
    max_connections: int = 2048  # open connections; past it new ones are closed at once
    # Requests a client may send ahead of their answers (HTTP/1.1 pipelining): uvicorn parses
    # every request it reads and queues the ones behind the one being answered, without bound.
    max_pipelined: int = 64  # queued requests per connection; past it the connection is closed
    max_pipelined_bytes: int = 8 * 1024 * 1024  # their heads and bodies, per connection
    max_pipelined_total: int = 256 * 1024 * 1024  # the same, all connections of the process


class _CoalescingTransport:
    """A transport whose writes of one loop iteration go out as one: uvicorn writes a
    response's head and body separately, and on a busy loop each write is a send() of its own
    (the second, measured, about doubled the server CPU per request against aiohttp's one)."""

    __slots__ = ("_buffer", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._buffer: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._buffer:
            self._loop.call_soon(self._flush)
        self._buffer.append(data)

    def _flush(self) -> None:
        if self._buffer:
            data = b"".join(self._buffer)
            self._buffer.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()  # the answer goes out before the connection ends
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for each request's head and body, a cap on
    the head's size and on the connections held (`bounds` is set on a subclass per server)."""

    bounds: Bounds = Bounds()
    queued_bytes: ClassVar[list[int]] = [0]  # pipelined requests' bytes held (one per server)
    overflowed: ClassVar[list[int]] = [0]  # connections closed for pipelining too far ahead

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = _CoalescingTransport(transport, self.loop)  # type: ignore[assignment]
        self._timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._queued: deque[int] = deque()  # bytes of each queued request, as uvicorn's pipeline
        self._overflow = False
        self._arm(self.bounds.header_timeout)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            self.transport.close()  # the handler, if any, sees the client as gone

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        if self._timer is None:  # a keep-alive connection's next request
            self._arm(self.bounds.header_timeout)

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.bounds.max_header_bytes:
            # raised inside the parser's callback: uvicorn answers 400 and closes
            raise ValueError("request head too large")

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._arm(self.bounds.body_timeout)
        queued = len(self.pipeline)
        super().on_headers_complete()
        if len(self.pipeline) > queued:  # it waits behind the request being answered
            self._queued.appendleft(0)
            self._hold(self._head_bytes)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        if self.pipeline and self.pipeline[0][0] is self.cycle:
            self._hold(len(body))

    def _hold(self, size: int) -> None:
        """Account for a queued request's bytes; past a bound, stop parsing and close."""
        self._queued[0] += size
        self.queued_bytes[0] += size
        bounds = self.bounds
        if (
            len(self._queued) > bounds.max_pipelined
            or sum(self._queued) > bounds.max_pipelined_bytes
            or self.queued_bytes[0] > bounds.max_pipelined_total
        ):
            self._overflow = True
            # raised inside the parser's callback: the parser stops; send_400_response closes
            raise ValueError("too many requests pipelined ahead of their answers")

    def send_400_response(self, msg: str) -> None:
        if not self._overflow:
            super().send_400_response(msg)
            return
        # No answer: a 400 now would be read as the answer to the request being served.
        self.overflowed[0] += 1
        logger.warning(
            "HTTP: closed a connection from %s that sent more than %d requests (or %d bytes) "
            "ahead of their answers",
            self.client[0] if self.client else "?",
            self.bounds.max_pipelined,
            self.bounds.max_pipelined_bytes,
        )
        self.transport.abort()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        queued = len(self.pipeline)
        super().on_response_complete()
        if len(self.pipeline) < queued:  # the oldest queued request is being answered now
            self.queued_bytes[0] -= self._queued.pop()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.queued_bytes[0] -= sum(self._queued)
        self._queued.clear()
        super().connection_lost(exc)


def _protocol(bounds: Bounds) -> type[_BoundedProtocol]:
    counters = {"queued_bytes": [0], "overflowed": [0]}
    return type("BoundedProtocol", (_BoundedProtocol,), {"bounds": bounds, **counters})


def bind(host: str, port: int, *, reuse_port: bool, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one); SO_REUSEPORT to share the
    port with the other workers of --workers N."""
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server(
            (host, port), family=family, backlog=backlog, reuse_port=reuse_port
        )
    except OSError as exc:
        raise OSError(exc.errno, f"cannot serve HTTP on {host}:{port}: {exc.strerror}") from exc
    sock.set_inheritable(False)
    return sock


class _Listener(socket.socket):
    """The listening socket: past `limit` connections held, a new one is closed at accept(),
    before it costs a protocol, a task or a TLS handshake (asyncio calls the application's
    protocol only once a handshake is done, so a limit counted there misses every connection
    still handshaking). Connections count from accept() to their socket's close()."""

    def __init__(self, sock: socket.socket, limit: int) -> None:
        super().__init__(sock.family, sock.type, sock.proto, fileno=sock.detach())
        self.limit = limit
        self.held = 0  # connections accepted and not yet closed
        self.refused = 0  # connections closed at the limit

    def accept(self) -> tuple[socket.socket, Any]:
        while True:  # BlockingIOError from _accept(): none left; asyncio waits for the next
            fd, address = self._accept()  # type: ignore[attr-defined]
            if self.held < self.limit:
                self.held += 1
                return _Connection(self, fd), address
            self.refused += 1
            os.close(fd)  # no answer: answering costs what the limit is there to save


class _Connection(socket.socket):
    """An accepted connection that gives its place back to the listener when closed."""

    def __init__(self, listener: _Listener, fd: int) -> None:
        super().__init__(listener.family, listener.type, listener.proto, fileno=fd)
        self._listener: _Listener | None = listener

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.held -= 1
        super().close()


class _Server(uvicorn.Server):
    """uvicorn's server on given sockets, with a deadline for the TLS handshake (uvicorn leaves
    asyncio's 60 s): a connection that never finishes one is held no longer than one that never
    finishes its request head."""

    handshake_timeout: float = 10.0

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await self.lifespan.startup()
        config, loop = self.config, asyncio.get_running_loop()

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config,
                server_state=self.server_state,
                app_state=self.lifespan.state,
                _loop=_loop,
            )

        handshake = self.handshake_timeout if config.ssl else None
        self.servers = [
            await loop.create_server(
                create_protocol,
                sock=sock,
                ssl=config.ssl,
                backlog=config.backlog,
                ssl_handshake_timeout=handshake,
            )
            for sock in sockets or ()
        ]
        self.started = True


class HttpServer:
    """One uvicorn server on an already-running event loop (uvicorn.Server's phases without its
    signal handling: textserve's server.py owns the signals)."""

    def __init__(
        self,
        app: HttpApp,
        bounds: Bounds,
        host: str,
        port: int,
        security: SecurityConfig,
        *,
        reuse_port: bool = False,
    ) -> None:
        self.app = app
        self.host = host
        self.protocol = _protocol(bounds)
        kwargs: dict[str, Any] = {}
        if security.tls_cert is not None:
            kwargs.update(ssl_certfile=str(security.tls_cert), ssl_keyfile=str(security.tls_key))
            if security.tls_client_ca is not None:
                kwargs.update(
                    ssl_ca_certs=str(security.tls_client_ca), ssl_cert_reqs=ssl.CERT_REQUIRED
                )
        self._config = uvicorn.Config(
            app,
            http=self.protocol,
            lifespan="off",
            interface="asgi3",
            log_config=None,
            access_log=False,  # textserve's own access log (--access-log json) covers HTTP
            server_header=False,
            timeout_keep_alive=int(max(1, bounds.keep_alive)),
            **kwargs,
        )
        self._sock = _Listener(bind(host, port, reuse_port=reuse_port), bounds.max_connections)
        self._handshake_timeout = bounds.header_timeout
        self.port: int = self._sock.getsockname()[1]
        self._server: uvicorn.Server | None = None
        self._ticks: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()  # a second signal: no more waiting for in-flight work

    @property
    def scheme(self) -> str:
        return "https" if self._config.is_ssl else "http"

    @property
    def refused(self) -> int:
        """Connections closed at once for being past the limit."""
        return self._sock.refused

    @property
    def connections(self) -> int:
        return 0 if self._server is None else len(self._server.server_state.connections)

    async def start(self) -> int:
        """Serve on the bound socket; returns the port."""
        config = self._config
        config.load()
        server = _Server(config)
        server.handshake_timeout = self._handshake_timeout
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[self._sock])
        self._server = server
        # Date headers once a second, as uvicorn's main loop does; ends on should_exit.
        self._ticks = asyncio.create_task(server.main_loop(), name="textserve-http-ticks")
        return self.port

    def hurry(self) -> None:
        """End a stop()'s wait for in-flight requests now (they are cancelled)."""
        self._hurry.set()

    async def drain(self, grace: float) -> None:
        """The app refuses new inference requests (503) while those in flight finish within
        `grace` seconds (or until hurry()); the probes and /metrics keep answering."""
        self.app.draining = True
        idle = asyncio.create_task(self.app.idle(grace))
        hurry = asyncio.create_task(self._hurry.wait())
        await asyncio.wait({idle, hurry}, return_when=asyncio.FIRST_COMPLETED)
        hurry.cancel()
        if not (idle.done() and idle.result()):
            idle.cancel()
            logger.warning(
                "HTTP: %d request(s) still in flight after the grace period: cancelled",
                self.app.inflight,
            )

    async def close(self) -> None:
        """Stop accepting, close the connections and cancel what is left. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            self._sock.close()
            return
        server.should_exit = True
        server.config.timeout_graceful_shutdown = 1  # only closing what is idle is left
        if self._ticks is not None:
            await self._ticks
        await server.shutdown(sockets=[self._sock])

    async def stop(self, grace: float) -> None:
        """drain(grace), then close()."""
        if self._server is not None:
            await self.drain(grace)
        await self.close()
