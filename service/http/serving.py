"""The HTTP front end as server.py starts it: the app, its server on the configured port, and
with --workers the supervisor's /metrics and readiness behind every worker's port.

    front = await http_front_end(ctx, reuse_port=False)   # serving on front.port
    front.app.set_readiness("serving")
    await front.server.stop(grace)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textserve.connect import read_tokens
from textserve.service.http.app import HttpApp, HttpLimits
from textserve.service.http.messages import TEXT, Response
from textserve.service.http.server import Bounds, HttpServer
from textserve.service.tokens import TokenSet

if TYPE_CHECKING:
    from textserve.service.dataplane.context import ServingContext

logger = logging.getLogger(__name__)

UPSTREAM_TIMEOUT = 5.0  # seconds a worker waits for the supervisor's /metrics or /readyz


@dataclass
class HttpFrontEnd:
    app: HttpApp
    server: HttpServer

    @property
    def port(self) -> int:
        return self.server.port


async def _upstream(address: str, path: str, accept: str | None) -> tuple[int, bytes, bytes]:
    """GET `path` from the supervisor's private endpoint: (status, content type, body)."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, int(port)), UPSTREAM_TIMEOUT
    )
    try:
        head = f"GET {path} HTTP/1.0\r\nHost: {address}\r\n"
        if accept:
            head += f"Accept: {accept}\r\n"
        writer.write((head + "\r\n").encode("latin-1"))
        raw = await asyncio.wait_for(reader.read(), UPSTREAM_TIMEOUT)
    finally:
        writer.close()
    header, _, body = raw.partition(b"\r\n\r\n")
    lines = header.split(b"\r\n")
    status = int(lines[0].split()[1])
    content_type = b"text/plain; charset=utf-8"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-type":
            content_type = value.strip()
    return status, content_type, body


def _from_supervisor(
    address: str,
) -> tuple[Callable[[str | None], Awaitable[Response]], Callable[[], Awaitable[str]]]:
    """The metrics page and readiness of the supervisor at `address` (--workers)."""

    async def metrics_page(accept: str | None) -> Response:
        try:
            status, content_type, body = await _upstream(address, "/metrics", accept)
        except (OSError, ValueError, IndexError, TimeoutError) as exc:
            message = f"the supervisor's metrics are unavailable: {exc}\n"
            return Response(503, message.encode(), TEXT)
        return Response(status, body, content_type)

    async def readiness() -> str:
        try:
            _, _, body = await _upstream(address, "/readyz", None)
        except (OSError, ValueError, IndexError, TimeoutError):
            return "warming"  # no supervisor to say every worker is warm: not ready
        return body.decode("utf-8", "replace").strip()

    return metrics_page, readiness


async def http_front_end(ctx: ServingContext, *, reuse_port: bool) -> HttpFrontEnd:
    """Bind and start the HTTP port of `ctx.config` (its readiness starts as warming)."""
    config = ctx.config
    assert config.metrics_port is not None
    http = config.http
    security = config.security
    tokens = None
    if security.auth_token_file is not None:
        tokens = TokenSet(read_tokens(security.auth_token_file))
    metrics_page = readiness = None
    if http.upstream is not None:
        metrics_page, readiness = _from_supervisor(http.upstream)
    app = HttpApp(
        ctx,
        HttpLimits(config.max_message_bytes, max_inflight=config.max_concurrent_rpcs),
        tokens=tokens,
        inference=http.inference,
        metrics_page=metrics_page,
        readiness=readiness,
    )
    bounds = Bounds(
        header_timeout=http.header_timeout,
        body_timeout=http.body_timeout,
        max_connections=http.max_connections,
    )
    server = HttpServer(
        app, bounds, config.metrics_host, config.metrics_port, security, reuse_port=reuse_port
    )
    await server.start()
    routes = "KServe v2 REST, /v1/classify, " if http.inference else ""
    logger.info(
        "metrics on %s://%s:%d/metrics (HTTP: %sprobes)",
        server.scheme, config.metrics_host, server.port, routes,
    )  # fmt: skip
    return HttpFrontEnd(app, server)
