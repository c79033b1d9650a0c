"""What stands before every servicer: bearer-token authentication (an interceptor, on only
with tokens), undecodable request messages answered INVALID_ARGUMENT and the drain's gate
(guards put on each method handler once, when it is registered).

    server = grpc.aio.server(interceptors=[*auth_interceptors(config.security)])
    registrar = GuardedRegistrar(server, gate)          # register every service through it

Tokens are checked by service/tokens.py (constant time, shared with HTTP). The
health and reflection services, and the Open Inference Protocol's ServerLive/ServerReady, stay
open so that probes and tools work without a token.

Undecodable messages:

grpc parses a request with the method's deserializer before any servicer code runs; when the
bytes are not a valid message (truncated, garbage, invalid UTF-8 in a string field) grpc
answers UNKNOWN with the exception's class name, and in a request stream the reading task dies
and the call hangs until its deadline. The guard wraps each method's deserializer so a
parse failure becomes a marker, and wraps the method so the marker is answered with
INVALID_ARGUMENT naming the method: a client error, reported as one. The same wrapper holds a
call that comes once the drain's gate is closed until the drain lets it run (service/drain.py),
counts the calls it runs for grpc's backlog (service/backlog.py) and answers RESOURCE_EXHAUSTED
to a call that waited in grpc longer than --max-backlog-wait-ms.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from textserve.connect import read_tokens
from textserve.service.config import SecurityConfig
from textserve.service.errors import ValidationError
from textserve.service.metric_labels import METHODS
from textserve.service.tokens import TokenSet, bearer_token

if TYPE_CHECKING:
    from textserve.service.backlog import Backlog
    from textserve.service.door import Door, MethodDoor

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


# Answered as usual while draining: health says NOT_SERVING itself (that is how a balancer
# learns to stop), reflection is harmless.
DRAIN_OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
DRAINING_MESSAGE = "the server is draining (shutting down); retry on another server or connection"


def _message(method: str, reason: str, index: int | None = None) -> str:
    which = "the request" if index is None else f"message {index} of the request stream"
    return f"{method}: {which} is not a valid protobuf message for this method ({reason})"


class Gate(Protocol):
    """What the guard asks of the drain's gate (service/drain.py DrainGate): whether it is
    closed, and, when it is, to hold a call until it may run (False: refuse it)."""

    closed: bool

    async def hold(self) -> bool: ...


class _Open:
    """The gate of a guard without one: never closed."""

    closed = False

    async def hold(self) -> bool:  # pragma: no cover - never closed
        return True


class _Uncounted:
    """The backlog of a guard without one (or of a call never refused for its age: health,
    reflection): counted, nothing refused."""

    def __init__(self) -> None:
        self.in_app = 0
        self.entries = 0
        self.shed_until = -1
        self.message = ""

    def refuse(self) -> None:  # pragma: no cover - shed_until is never reached
        pass


async def _check(
    method: str, request: Any, context: grpc.aio.ServicerContext, gate: Gate, shed: Any
) -> None:
    """The guard's slow path: RESOURCE_EXHAUSTED for a call that waited too long in grpc
    (`shed`: its backlog, else None); while the gate is closed, hold the call until the drain
    lets it run (UNAVAILABLE when it may not); then INVALID_ARGUMENT for a message that did not
    parse."""
    if shed is not None:
        shed.refuse()
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, shed.message)
    if gate.closed and not await gate.hold():
        await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
    if isinstance(request, Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _message(method, request.reason))


def _taken(backlog: Any, sheddable: bool, door: MethodDoor | None) -> Any:
    """Count a call the loop took from grpc (running until the caller's `finally` counts it
    out of backlog.in_app, and out of the door when it went through it): its backlog when it
    is among those to refuse for their wait in grpc, the door when it is past the door's
    bound (service/door.py), else None (in, and through the door when there is one)."""
    backlog.in_app += 1
    backlog.entries += 1
    if sheddable and backlog.entries <= backlog.shed_until:
        return backlog
    if door is not None and not door.enter():
        return door
    return None


def _plain(behavior: Callable[..., Any]) -> Callable[..., Any]:
    """`behavior` as a coroutine function (grpc allows plain functions too)."""
    if inspect.iscoroutinefunction(behavior):
        return behavior
    plain = behavior

    async def awaited(request: Any, context: grpc.aio.ServicerContext) -> Any:
        result = plain(request, context)
        return await result if inspect.isawaitable(result) else result

    return awaited


def _guard_unary(
    method: str,
    behavior: Callable[..., Any],
    gate: Gate,
    backlog: Any,
    sheddable: bool,
) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behavior):

        async def guarded_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            shed = _taken(backlog, sheddable, None)
            try:
                if shed is not None or gate.closed or isinstance(request, Undecodable):
                    await _check(method, request, context, gate, shed)
                async for response in behavior(request, context):
                    yield response
            finally:
                backlog.in_app -= 1

        return guarded_stream

    behavior = _plain(behavior)

    # The hot path of every unary call: the backlog's counts (_taken), one attribute read and
    # one isinstance before the servicer (measured: the interceptor chain this replaces cost
    # two coroutines per call).
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        shed = _taken(backlog, sheddable, None)
        try:
            if shed is not None or gate.closed or isinstance(request, Undecodable):
                await _check(method, request, context, gate, shed)
            return await behavior(request, context)
        finally:
            backlog.in_app -= 1

    return guarded


NO_MESSAGE = "the request has no message (a unary method takes exactly one)"


def _guard_door(
    method: str, behavior: Callable[..., Any], gate: Gate, backlog: Any, door: MethodDoor
) -> Callable[..., Any]:
    """A unary inference call through the door (service/door.py), as grpc.aio's stream-unary
    shape: the door and the backlog judge the call before its message is read, and a refusal
    is a status set and returned (no exception, no message received, no parse); the gate and
    the decode guard then judge it as any unary call (`_check`). What one refusal costs the
    server (`python -m textserve.bench.refusal`, bench/results/refusal, 2 vCPUs): this 1.11x
    grpc.aio's own limiter's, context.abort in a unary handler 1.25x; the door's refusals are
    most of a worker's work under overload. A caller sees a unary call either way (one
    message, one answer, one status)."""

    async def guarded(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        shed = _taken(backlog, True, door)
        try:
            if shed is not None:
                shed.refuse()
                context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
                context.set_details(shed.message)
                return None
            request = await context.read()
            if request is grpc.aio.EOF:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: {NO_MESSAGE}")
            if gate.closed or isinstance(request, Undecodable):
                await _check(method, request, context, gate, None)
            return await behavior(request, context)
        finally:
            backlog.in_app -= 1
            if shed is None:  # let in through the door: out of it again
                door.leave()

    return guarded


async def _checked_messages(method: str, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    index = 0
    async for request in requests:
        if isinstance(request, Undecodable):
            raise UndecodableMessageError(_message(method, request.reason, index))
        yield request
        index += 1


def _guard_streaming(
    method: str, behavior: Callable[..., Any], gate: Gate, backlog: Any, sheddable: bool
) -> Callable[..., Any]:
    # not through the door: a stream's messages are bounded by --stream-max-inflight
    if inspect.isasyncgenfunction(behavior):

        async def guarded_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            shed = _taken(backlog, sheddable, None)
            try:
                if shed is not None or gate.closed:
                    await _check(method, None, context, gate, shed)
                try:
                    async for response in behavior(_checked_messages(method, requests), context):
                        yield response
                except UndecodableMessageError as exc:  # the servicer let it through: answer it
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            finally:
                backlog.in_app -= 1

        return guarded_stream

    async def guarded(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        shed = _taken(backlog, sheddable, None)
        try:
            if shed is not None or gate.closed:
                await _check(method, None, context, gate, shed)
            try:
                result = behavior(_checked_messages(method, requests), context)
                return await result if inspect.isawaitable(result) else result
            except UndecodableMessageError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            backlog.in_app -= 1

    return guarded


def guard(
    method: str,
    handler: grpc.RpcMethodHandler,
    gate: Gate | None = None,
    backlog: Backlog | None = None,
    door: Door | None = None,
) -> grpc.RpcMethodHandler:
    """`handler` with a deserializer that cannot raise, a behaviour that answers an
    undecodable message with INVALID_ARGUMENT and, once `gate` is closed (the drain), holds
    every new call until the drain lets it run (or refuses it UNAVAILABLE: DRAINING_MESSAGE).
    With `backlog` (service/backlog.py) each call is counted while it runs, and a call among
    those that waited too long in grpc is answered RESOURCE_EXHAUSTED before it runs (never
    a health check or reflection: they answer as long as the server does). With `door`
    (service/door.py) a unary inference call (its name in metric_labels.METHODS) past the
    door's bound is answered RESOURCE_EXHAUSTED before it runs."""
    gate = gate or _Open()
    sheddable = True
    if method.startswith(DRAIN_OPEN_SERVICES):
        gate = _Open()  # health says NOT_SERVING itself while draining; reflection is harmless
        sheddable = False
    deserializer = handler.request_deserializer
    if deserializer is None and isinstance(gate, _Open) and backlog is None:  # raw bytes in
        return handler
    counted: Any = _Uncounted() if backlog is None else backlog
    safe = deserializer if deserializer is None else safe_deserializer(deserializer)
    serializer = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        behavior = _guard_streaming(method, handler.stream_stream, gate, counted, sheddable)
        return grpc.stream_stream_rpc_method_handler(behavior, safe, serializer)
    if handler.request_streaming:
        behavior = _guard_streaming(method, handler.stream_unary, gate, counted, sheddable)
        return grpc.stream_unary_rpc_method_handler(behavior, safe, serializer)
    if handler.response_streaming:
        behavior = _guard_unary(method, handler.unary_stream, gate, counted, sheddable)
        return grpc.unary_stream_rpc_method_handler(behavior, safe, serializer)
    name = method.rpartition("/")[2]
    if door is not None and sheddable and name in METHODS:
        unary = _plain(handler.unary_unary)
        behavior = _guard_door(method, unary, gate, counted, door.at(name))
        return grpc.stream_unary_rpc_method_handler(behavior, safe, serializer)
    behavior = _guard_unary(method, handler.unary_unary, gate, counted, sheddable)
    return grpc.unary_unary_rpc_method_handler(behavior, safe, serializer)


class _GuardedGeneric(grpc.GenericRpcHandler):
    """A generic handler whose method handlers come out guarded (built once per method)."""

    def __init__(
        self,
        inner: grpc.GenericRpcHandler,
        gate: Gate,
        backlog: Backlog | None = None,
        door: Door | None = None,
    ) -> None:
        self._inner = inner
        self._gate = gate
        self._backlog = backlog
        self._door = door
        self._cache: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cached = self._cache.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        guarded = guard(method, handler, self._gate, self._backlog, self._door)
        self._cache[method] = (handler, guarded)
        return guarded


class GuardedRegistrar:
    """The grpc server as the services' register functions see it: every method handler they
    add is guarded (`guard`: undecodable messages, the drain's gate, grpc's backlog) once, when
    it is added,
    instead of by an interceptor on every call (an interceptor costs each call a coroutine and
    a continuation; this, one check in the wrapper the guard needs anyway). Everything else is
    the server's own.

        registrar = GuardedRegistrar(grpc_server, gate, backlog)
        pb_grpc.add_ClassifierServicer_to_server(servicer, registrar)
    """

    def __init__(
        self,
        server: grpc.aio.Server,
        gate: Gate | None = None,
        backlog: Backlog | None = None,
        door: Door | None = None,
    ) -> None:
        self._server = server
        self._gate = gate or _Open()
        self._backlog = backlog
        self._door = door

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(
                _GuardedGeneric(handler, self._gate, self._backlog, self._door)
                for handler in handlers
            )
        )

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self._server.add_registered_method_handlers(
            service,
            {
                name: guard(f"/{service}/{name}", h, self._gate, self._backlog, self._door)
                for name, h in handlers.items()
            },
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


# A grpc.aio.Server to code that asks (grpc_reflection registers its asyncio servicer only on one).
grpc.aio.Server.register(GuardedRegistrar)
