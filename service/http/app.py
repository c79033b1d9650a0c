"""The HTTP front end as one bare ASGI application: routing, authentication, body limits, the
taxonomy's statuses and draining, around the route handlers of routes.py.

    app = HttpApp(ctx, HttpLimits(), tokens=None)      # tokens: a TokenSet when auth is on
    app.set_readiness("serving")                     # what /readyz answers (READY_STATES)
    app.draining = True                              # SIGTERM: new inference requests get 503

A bare ASGI callable rather than a framework (Starlette, FastAPI): the routes are a fixed, small
set, and per request a framework's Request/Response objects and middleware stack cost more
server CPU than the routing itself (docs/http.md has the measurements).
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textserve.service.door import Door
from textserve.service.http import routes
from textserve.service.http.errors import error_body, textserve_error
from textserve.service.http.messages import JSON, ErrorShape, Request, Response, Route
from textserve.service.metrics import READY_STATES, WARMING
from textserve.service.tokens import TokenSet, bearer_token

if TYPE_CHECKING:
    from textserve.service.dataplane.context import ServingContext

logger = logging.getLogger(__name__)

# The deadline header: seconds, like grpc-timeout's meaning (Envoy and KServe clients speak
# of a request timeout; a number of seconds is what curl users can write).
TIMEOUT_HEADER = "request-timeout"
_LOG_EVERY = 10.0  # seconds between log lines about refused requests


@dataclass(frozen=True)
class HttpLimits:
    """What one connection and one request may take of the server (config.HttpConfig)."""

    max_body_bytes: int = 4 * 1024 * 1024  # --max-message-bytes, as on gRPC
    # --max-concurrent-rpcs, as on gRPC (where grpc.aio refuses past it): inference requests
    # being answered at once by this process (the door's count when the server gives none);
    # past it 429 + Retry-After at once. None: no bound.
    max_inflight: int | None = None


class ClientGone(Exception):
    """The client closed its connection before its request was read whole."""


class Refused(Exception):
    """An answer decided before the handler runs (404, 405, 401, 413, 503)."""

    def __init__(self, status: int, message: str, code: str, headers: Any = ()) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.headers = list(headers)


class HttpApp:
    """The ASGI application: `await app(scope, receive, send)` per request (uvicorn's)."""

    def __init__(
        self,
        ctx: ServingContext,
        limits: HttpLimits,
        *,
        tokens: TokenSet | None = None,
        inference: bool = True,
        metrics_page: Callable[[str | None], Awaitable[Response]] | None = None,
        readiness: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.limits = limits
        self.tokens = tokens
        self.inference = inference
        self.readiness = WARMING
        self.draining = False
        self.inflight = 0  # inference requests being answered
        # the bound on inference requests in flight (service/door.py): the server's, shared
        # with gRPC; a front end without one bounds its own by the count alone
        self.door = ctx.door or Door(limits.max_inflight, None, refusals=ctx.metrics.limit_refusals)
        self._idle = asyncio.Event()
        self._idle.set()
        # --workers: the supervisor's /metrics (every worker summed) and its readiness
        self.metrics_page = metrics_page or routes.local_metrics(ctx.metrics.registry)
        self._upstream_readiness = readiness
        self._match = routes.matcher()
        self._refused = 0
        self._logged_at = -_LOG_EVERY

    def set_readiness(self, state: str) -> None:
        if state not in READY_STATES:
            raise ValueError(f"unknown readiness state {state!r}; expected one of {READY_STATES}")
        self.readiness = state

    async def readiness_of(self) -> str:
        """What /readyz answers: this server's state, or with --workers the supervisor's."""
        if self._upstream_readiness is not None and not self.draining:
            return await self._upstream_readiness()
        return self.readiness

    async def idle(self, timeout: float) -> bool:
        """Wait until no inference request is being answered (True) or `timeout` passed."""
        if self._idle.is_set():
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; websockets are not served
        try:
            route, params = self._route(scope)
        except Refused as refused:
            await _send(send, _refusal(refused))
            return
        try:
            request = Request(scope, params)
            self._admit(route, request)
        except Refused as refused:
            await _send(send, _refusal(refused, route.errors))
            return
        if not route.inference:
            response = await self._answer(route, request, receive)
            await _send(send, response)
            return
        door = self.door
        if not door.enter():  # last: nothing refuses it once in
            door.count_refusal(route.method)
            await _send(send, _refusal(_busy(door.message), route.errors))
            return
        self.inflight += 1
        self._idle.clear()
        try:
            response = await self._answer(route, request, receive)
            if self.draining:  # the client should take its next request elsewhere
                response.headers.append((b"connection", b"close"))
            await _send(send, response)
        finally:
            self.inflight -= 1
            door.leave()
            if self.inflight == 0:
                self._idle.set()

    def _route(self, scope: dict[str, Any]) -> tuple[Route, dict[str, str]]:
        found = self._match(scope["path"])
        if found is None:
            raise Refused(404, f"no route {scope['path'][:200]!r}; see /openapi.json", "NOT_FOUND")
        methods, params = found
        method = scope["method"]
        # HEAD wherever GET is (RFC 9110 9.3.2): the same status and headers; uvicorn sends
        # no body for a HEAD request.
        route = methods.get(method) or (methods.get("GET") if method == "HEAD" else None)
        if route is None:
            allow = ", ".join(sorted({*methods, *(["HEAD"] if "GET" in methods else [])}))
            raise Refused(
                405,
                f"{scope['method']} is not allowed here; use {allow}",
                "UNIMPLEMENTED",
                [(b"allow", allow.encode())],
            )
        if route.inference and not self.inference:
            raise Refused(404, "the inference routes are off (--http-port off)", "NOT_FOUND")
        return route, params

    def _admit(self, route: Route, request: Request) -> None:
        """Authentication (same tokens as gRPC), draining, and the declared body size: all
        decided on the headers, before a byte of the body is read."""
        if not route.open and self.tokens is not None:
            token, problem = bearer_token(request.headers)
            if token is not None and not self.tokens.matches(token):
                problem = "invalid bearer token"
            if token is None or problem:
                self._note_refusal(request.path, problem)
                raise Refused(
                    401,
                    problem.replace("metadata", "header"),
                    "UNAUTHENTICATED",
                    [(b"www-authenticate", b"Bearer")],
                )
        if route.inference and self.draining:
            raise Refused(
                503,
                "the server is draining (shutting down); retry on another replica",
                "UNAVAILABLE",
                [(b"connection", b"close")],
            )
        declared = request.header("content-length")
        if (
            declared is not None
            and declared.isdigit()
            and int(declared) > self.limits.max_body_bytes
        ):
            raise _too_large(self.limits.max_body_bytes)
        timeout = request.header(TIMEOUT_HEADER)
        if timeout is not None:
            try:
                seconds = float(timeout)
            except ValueError:
                seconds = -1.0
            if not 0 < seconds <= 86400 * 365:
                raise Refused(
                    400,
                    f"Request-Timeout must be a positive number of seconds, got {timeout[:50]!r}",
                    "INVALID_ARGUMENT",
                )
            request.deadline = time.monotonic() + seconds

    async def _answer(self, route: Route, request: Request, receive: Any) -> Response:
        try:
            if route.body:
                body = await _read_body(receive, self.limits.max_body_bytes)
                request.body = _decoded(body, request.header("content-encoding"), self.limits)
            return await route.handler(self, request)
        except Refused as refused:
            return _refusal(refused, route.errors)
        except ClientGone:  # nobody reads the answer (uvicorn drops it): not an error
            return Response(499, b"")
        except Exception as exc:  # the one place unexpected errors become 500
            what = f"HTTP {request.method} {route.handler.__name__}"
            status, body = error_body(exc, what, route.errors or textserve_error)
            return Response(status, body)

    def _note_refusal(self, path: str, problem: str) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY:
            logger.warning(
                "refused %d unauthenticated HTTP request(s) (latest: %s: %s)",
                self._refused, path[:200], problem,
            )  # fmt: skip
            self._refused, self._logged_at = 0, now


def _busy(message: str) -> Refused:
    """429 at the door: overload, retryable after a short wait."""
    return Refused(429, message, "RESOURCE_EXHAUSTED", [(b"retry-after", b"1")])


def _too_large(limit: int) -> Refused:
    return Refused(
        413,
        f"the request body is larger than {limit} bytes (--max-message-bytes)",
        "RESOURCE_EXHAUSTED",
        [(b"connection", b"close")],  # the rest of the body is never read
    )


async def _read_body(receive: Any, limit: int) -> bytes:
    """The request body, refused (413) as soon as it passes `limit`: what was not read yet is
    never read (uvicorn stops reading the socket while the app does not take the body)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone("the client went away before its body was read")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _decoded(body: bytes, encoding: str | None, limits: HttpLimits) -> bytes:
    """The request body as sent before its Content-Encoding: gzip (and deflate) are undone,
    held to the same limit once decompressed (a small bomb is refused, not inflated); any
    other coding is refused with 415."""
    coding = (encoding or "identity").strip().lower()
    if coding == "identity":
        return body
    if coding not in ("gzip", "x-gzip", "deflate"):
        raise Refused(
            415,
            f"Content-Encoding {coding[:40]!r} is not supported; send gzip, deflate or none",
            "INVALID_ARGUMENT",
            [(b"accept-encoding", b"gzip, deflate")],
        )
    window = 16 + zlib.MAX_WBITS if coding != "deflate" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(window)
    try:
        data = inflater.decompress(body, limits.max_body_bytes + 1)
    except zlib.error as exc:
        message = f"the {coding} request body is corrupt ({exc})"
        raise Refused(400, message, "INVALID_ARGUMENT") from None
    if len(data) > limits.max_body_bytes or inflater.unconsumed_tail:
        raise _too_large(limits.max_body_bytes)
    if not inflater.eof:
        raise Refused(400, f"the {coding} request body is truncated", "INVALID_ARGUMENT")
    return data


def _refusal(refused: Refused, shape: ErrorShape | None = None) -> Response:
    shape = shape or textserve_error
    return Response(
        refused.status, shape(refused.status, str(refused), refused.code), JSON, refused.headers
    )


async def _send(send: Any, response: Response) -> None:
    headers = [
        (b"content-type", response.content_type),
        (b"content-length", str(len(response.body)).encode()),
        *response.headers,
    ]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})
