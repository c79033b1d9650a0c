"""Undecodable request messages become INVALID_ARGUMENT, for every service on the port.

grpc parses a request with the method's deserializer before any servicer code runs; when the
bytes are not a valid message (truncated, garbage, invalid UTF-8 in a string field) grpc
answers UNKNOWN with the exception's class name, and in a request stream the reading task dies
and the call hangs until its deadline. This interceptor wraps each method's deserializer so a
parse failure becomes a marker, and wraps the method so the marker is answered with
INVALID_ARGUMENT naming the method: a client error, reported as one.

    server = grpc.aio.server(interceptors=[DecodeGuard()])
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from service.errors import ValidationError


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
