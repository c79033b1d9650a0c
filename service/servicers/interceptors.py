"""The server's interceptors: bearer-token authentication, and undecodable request messages
answered INVALID_ARGUMENT, for every service on the port.

    server = grpc.aio.server(interceptors=[*auth_interceptors(config.security), DecodeGuard()])

Tokens are compared in constant time (hmac.compare_digest over SHA-256 digests, against every
token, so neither the position of a match nor the tokens' lengths show in the timing). The
health and reflection services, and the Open Inference Protocol's ServerLive/ServerReady, stay
open so that probes and tools work without a token.

Undecodable messages:

grpc parses a request with the method's deserializer before any servicer code runs; when the
bytes are not a valid message (truncated, garbage, invalid UTF-8 in a string field) grpc
answers UNKNOWN with the exception's class name, and in a request stream the reading task dies
and the call hangs until its deadline. This interceptor wraps each method's deserializer so a
parse failure becomes a marker, and wraps the method so the marker is answered with
INVALID_ARGUMENT naming the method: a client error, reported as one.

    server = grpc.aio.server(interceptors=[DecodeGuard()])
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import grpc

from textserve.connect import AUTHORIZATION, SCHEME, read_tokens
from textserve.service.config import SecurityConfig
from textserve.service.errors import ValidationError

logger = logging.getLogger(__name__)

# Services answered without a token: orchestrator probes (health) and tools (reflection).
OPEN_SERVICES: frozenset[str] = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)
# Single methods answered without a token: the Open Inference Protocol's liveness and
# readiness probes (what KServe's and Triton's orchestration call; they reveal nothing but
# "up"). Everything else of that service, ModelReady and metadata included, needs a token.
OPEN_METHODS: frozenset[str] = frozenset(
    {
        "/inference.GRPCInferenceService/ServerLive",
        "/inference.GRPCInferenceService/ServerReady",
    }
)
_LOG_EVERY = 10.0  # seconds between log lines about refused calls (a flood must not flood logs)


# -- bearer tokens --------------------------------------------------------------------------------


def _digest(token: str | bytes) -> bytes:
    data = token.encode("utf-8", "surrogateescape") if isinstance(token, str) else token
    return hashlib.sha256(data).digest()


class TokenSet:
    """Accepted bearer tokens; `matches` takes the same time whichever token (if any) matches."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self._digests = [_digest(t) for t in tokens]
        if not self._digests:
            raise ValueError("a TokenSet needs at least one token")

    def matches(self, presented: str | bytes) -> bool:
        digest = _digest(presented)
        matched = False
        for expected in self._digests:  # no early exit: every token is compared
            matched |= hmac.compare_digest(digest, expected)
        return matched


def bearer_token(metadata: Iterable[tuple[str, Any]] | None) -> tuple[str | None, str]:
    """(token, "") from `authorization: Bearer <token>` metadata, else (None, why not)."""
    values = [value for key, value in metadata or () if key.lower() == AUTHORIZATION]
    if not values:
        return None, (
            "missing credentials: this server needs 'authorization: Bearer <token>' metadata"
        )
    if len(values) > 1:
        return None, "send one authorization metadata entry, not several"
    value = values[0].decode("latin-1") if isinstance(values[0], bytes) else str(values[0])
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != SCHEME or not token.strip():
        return None, "authorization metadata must be 'Bearer <token>'"
    return token.strip(), ""


def _service_of(method: str) -> str:
    """The service of a method path: /pkg.Service/Method -> pkg.Service."""
    return method.rsplit("/", 2)[-2] if method.count("/") >= 2 else ""


def refusal_handler(
    handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str
) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that answers `code` without reading the request
    (no deserializer: a refused request costs no parsing)."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    serializer = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, None, serializer)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, None, serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, None, serializer)
    return grpc.unary_unary_rpc_method_handler(refuse, None, serializer)


Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for calls without a valid bearer token, except to `open_services` and
    `open_methods`."""

    def __init__(
        self,
        tokens: Iterable[str],
        open_services: Iterable[str] = OPEN_SERVICES,
        clock: Callable[[], float] = time.monotonic,
        open_methods: Iterable[str] = OPEN_METHODS,
    ) -> None:
        self._tokens = TokenSet(tokens)
        self._open = frozenset(open_services)
        self._open_methods = frozenset(open_methods)
        self._clock = clock
        self._refused = 0  # since the last log line
        self._logged_at = -_LOG_EVERY

    def check(self, method: str, metadata: Iterable[tuple[str, Any]] | None) -> str:
        """The empty string when the call may go on, else the message to refuse it with."""
        if method in self._open_methods or _service_of(method) in self._open:
            return ""
        token, problem = bearer_token(metadata)
        if token is None:
            return problem
        return "" if self._tokens.matches(token) else "invalid bearer token"

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        details = handler_call_details
        problem = self.check(details.method, details.invocation_metadata)
        handler = await continuation(details)
        if not problem or handler is None:
            return handler
        self._note_refusal(details.method, problem)
        return refusal_handler(handler, grpc.StatusCode.UNAUTHENTICATED, problem)

    def _note_refusal(self, method: str, problem: str) -> None:
        self._refused += 1
        now = self._clock()
        if now - self._logged_at >= _LOG_EVERY:
            logger.warning(
                "refused %d unauthenticated call(s) (latest: %s: %s)",
                self._refused, method, problem,
            )  # fmt: skip
            self._refused, self._logged_at = 0, now


def auth_interceptors(security: SecurityConfig) -> list[grpc.aio.ServerInterceptor]:
    """The interceptors `security` asks for (reads the token file)."""
    if security.auth_token_file is None:
        return []
    tokens = read_tokens(security.auth_token_file)
    logger.info("bearer-token authentication on (%d token(s))", len(tokens))
    return [TokenAuthInterceptor(tokens)]


# -- undecodable messages -------------------------------------------------------------------------


class UndecodableMessageError(ValidationError):
    """A message of a request stream did not parse. Raised from the request iterator, so the
    servicer unwinds first (its own error mapping, or the guard's, then answers
    INVALID_ARGUMENT once): aborting from inside the iterator would race the servicer's writes."""


class Undecodable:
    """Stands in for a request message that failed to parse."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def safe_deserializer(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # DecodeError, or UnicodeDecodeError from some runtimes
            return Undecodable(f"{type(exc).__name__}: {exc}")

    return deserialize


def _message(method: str, reason: str, index: int | None = None) -> str:
    which = "the request" if index is None else f"message {index} of the request stream"
    return f"{method}: {which} is not a valid protobuf message for this method ({reason})"


def _guard_unary(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def check(request: Any, context: grpc.aio.ServicerContext) -> None:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _message(method, request.reason))

    if inspect.isasyncgenfunction(behavior):

        async def guarded_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(request, context)
            async for response in behavior(request, context):
                yield response

        return guarded_stream

    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await check(request, context)
        result = behavior(request, context)
        return await result if inspect.isawaitable(result) else result

    return guarded


async def _checked_messages(method: str, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    index = 0
    async for request in requests:
        if isinstance(request, Undecodable):
            raise UndecodableMessageError(_message(method, request.reason, index))
        yield request
        index += 1


def _guard_streaming(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behavior):

        async def guarded_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                async for response in behavior(_checked_messages(method, requests), context):
                    yield response
            except UndecodableMessageError as exc:  # the servicer let it through: answer it
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

        return guarded_stream

    async def guarded(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            result = behavior(_checked_messages(method, requests), context)
            return await result if inspect.isawaitable(result) else result
        except UndecodableMessageError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    return guarded


def guard(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """`handler` with a deserializer that cannot raise and a behaviour that answers an
    undecodable message with INVALID_ARGUMENT."""
    deserializer = handler.request_deserializer
    if deserializer is None:  # raw bytes in: nothing can fail to parse
        return handler
    safe = safe_deserializer(deserializer)
    serializer = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        behavior = _guard_streaming(method, handler.stream_stream)
        return grpc.stream_stream_rpc_method_handler(behavior, safe, serializer)
    if handler.request_streaming:
        behavior = _guard_streaming(method, handler.stream_unary)
        return grpc.stream_unary_rpc_method_handler(behavior, safe, serializer)
    if handler.response_streaming:
        behavior = _guard_unary(method, handler.unary_stream)
        return grpc.unary_stream_rpc_method_handler(behavior, safe, serializer)
    behavior = _guard_unary(method, handler.unary_unary)
    return grpc.unary_unary_rpc_method_handler(behavior, safe, serializer)


class DecodeGuard(grpc.aio.ServerInterceptor):
    """Applies `guard` to every method served."""

    def __init__(self) -> None:
        # method -> (handler, guarded): the wrapping is built once per method, not per call
        self._cache: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cached = self._cache.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        guarded = guard(method, handler)
        self._cache[method] = (handler, guarded)
        return guarded
