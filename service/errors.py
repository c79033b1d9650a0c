"""The serving error taxonomy, its one mapping to gRPC status codes, and the wrapper using it.

Core code (batcher, repository, model handles) raises these and never a transport exception;
front ends turn them into statuses through `grpc_code` / `grpc_errors`, so a code is decided
in exactly one place. grpc is imported lazily here because the batcher imports this module and
must stay free of grpc.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

logger = logging.getLogger(__name__)


class ServiceError(Exception):
    """Base of every error a front end reports to its caller (message shown as is)."""


class ValidationError(ServiceError):
    """The request is malformed: no texts, an empty text, too long, a bad option."""


class ModelNotFoundError(ServiceError):
    """No such model or version; the message lists what exists."""


class NotReadyError(ServiceError):
    """The model exists but is not serving (loading, failed, or the server is draining)."""


class OverloadedError(ServiceError):
    """The model's queue is full: refused at once rather than queued without bound."""


class DeadlineExceededError(ServiceError):
    """The caller's deadline passed before its texts reached the model."""


class CancelledError(ServiceError):
    """The caller went away; its texts were dropped before inference."""


class LoadFailedError(ServiceError):
    """A model version asked for (admin LoadModel) was refused: broken files; see the reason."""


class InternalError(ServiceError):
    """Something failed that the caller cannot fix (inference error...)."""


# The one table: exception class -> grpc.StatusCode member name. Looked up along the MRO so a
# subclass inherits its parent's code.
GRPC_CODES: dict[type[ServiceError], str] = {
    ValidationError: "INVALID_ARGUMENT",
    ModelNotFoundError: "NOT_FOUND",
    NotReadyError: "UNAVAILABLE",
    OverloadedError: "RESOURCE_EXHAUSTED",
    DeadlineExceededError: "DEADLINE_EXCEEDED",
    CancelledError: "CANCELLED",
    LoadFailedError: "FAILED_PRECONDITION",
    InternalError: "INTERNAL",
    ServiceError: "INTERNAL",
}


def code_name(exc: BaseException) -> str:
    """The grpc.StatusCode name for an exception; anything outside the taxonomy is INTERNAL."""
    for cls in type(exc).__mro__:
        if cls in GRPC_CODES:
            return GRPC_CODES[cls]
    return "INTERNAL"


def public_message(exc: BaseException) -> str:
    """What the caller is told: our own message, never internals of an unexpected exception."""
    if isinstance(exc, ServiceError):
        return str(exc)
    return "internal error (logged on the server)"


def grpc_code(exc: BaseException) -> Any:
    """The grpc.StatusCode for an exception."""
    import grpc

    return grpc.StatusCode[code_name(exc)]


def log_unexpected(exc: BaseException, what: str) -> None:
    """Log an exception outside the taxonomy with its traceback (the server goes on)."""
    if not isinstance(exc, ServiceError):
        logger.error("unexpected error in %s", what, exc_info=exc)


def grpc_errors(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Decorate an async unary servicer method: taxonomy -> its status; anything else ->
    INTERNAL after logging the traceback. Aborts from the method itself pass through."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: Any) -> Any:
        import grpc

        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # the one place unexpected errors become INTERNAL
            log_unexpected(exc, method.__qualname__)
            await context.abort(grpc_code(exc), public_message(exc))

    return wrapper


def grpc_stream_errors(
    method: Callable[..., AsyncIterator[Any]],
) -> Callable[..., AsyncIterator[Any]]:
    """The same as grpc_errors for async-generator (streaming response) methods."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
        import grpc

        try:
            async for item in method(self, request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            log_unexpected(exc, method.__qualname__)
            await context.abort(grpc_code(exc), public_message(exc))

    return wrapper
