"""The gRPC side of every servicer: the code table as grpc.StatusCode, the error decorator and
deadlines.

    @grpc_errors                                   # taxonomy -> its status; the rest INTERNAL
    async def Classify(self, request, context):
        with observed(metrics, "Classify", deadline_of(context)) as seen:
            ...

The table itself is the data plane's (dataplane/codes.py): the HTTP codec maps the same code
names to HTTP statuses.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from textserve.service.dataplane.codes import code_name, log_unexpected, public_message

logger = logging.getLogger(__name__)


def grpc_code(exc: BaseException) -> grpc.StatusCode:
    """The grpc.StatusCode for an exception."""
    return grpc.StatusCode[code_name(exc)]


def call_ended(context: Any) -> bool:
    """Whether grpc has ended the call already: cancelled, or its deadline passed."""
    remaining = context.time_remaining()
    return bool(context.cancelled()) or (remaining is not None and remaining <= 0)


def grpc_errors(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Decorate an async unary servicer method: taxonomy -> its status; anything else ->
    INTERNAL after logging the traceback. Aborts from the method itself pass through."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # the one place unexpected errors become INTERNAL
            log_unexpected(exc, method.__qualname__)
            if call_ended(context):
                # grpc already ended the call (its deadline passed, the caller went away):
                # there is nobody to answer, and aborting would fail inside grpc with an
                # ERROR traceback the caller's timing alone decides.
                logger.debug("%s: the call had ended before its answer (%s)", method.__name__, exc)
                raise asyncio.CancelledError from None
            await context.abort(grpc_code(exc), public_message(exc))

    return wrapper


# grpc cancels the handler at the very deadline it reports; the queue's deadline is set this much
# earlier so that a request expiring in the queue is answered by the server's own
# DEADLINE_EXCEEDED (the model and the wait in its message, `dropped_deadline` counted), not
# by a cancellation that races it. 50 ms: more than the event loop's lag between the queue's
# expiry and the answer being sent under load (10 ms lost that race: callers with deadlines of
# 20-200 ms saw grpc end calls the server was still answering).
DEADLINE_MARGIN_S = 0.05


def deadline_of(context: Any) -> float | None:
    """The call's deadline as absolute time.monotonic() seconds (None: no deadline), a margin
    early: DEADLINE_MARGIN_S."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining - DEADLINE_MARGIN_S
