"""The transport side of every servicer: ONE status table, request observation and deadlines.

    @grpc_errors                                   # taxonomy -> its status; the rest INTERNAL
    async def Classify(self, request, context):
        with observed(metrics, "Classify", deadline_of(context)) as seen:
            handle = resolve(repository, request.model, request.version)
            seen.model = handle.name
            ...

Both front ends (textserve.v1 and the Open Inference Protocol) and the admin service use these,
so a status code, and the code a request is counted with in the metrics, is decided here once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from textserve.artifact import shown
from textserve.service.errors import (
    CancelledError,
    DeadlineExceededError,
    InternalError,
    LoadFailedError,
    ModelNotFoundError,
    NotReadyError,
    OverloadedError,
    ServiceError,
    ValidationError,
)

if TYPE_CHECKING:
    from textserve.service.engine.handle import ClassifyResult
    from textserve.service.metrics import Metrics
    from textserve.service.servicers.context import Telemetry
    from textserve.service.tracing import RequestTrace

logger = logging.getLogger(__name__)


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


def grpc_code(exc: BaseException) -> grpc.StatusCode:
    """The grpc.StatusCode for an exception."""
    return grpc.StatusCode[code_name(exc)]


def log_unexpected(exc: BaseException, what: str) -> None:
    """Log an exception outside the taxonomy with its traceback (the server goes on)."""
    if not isinstance(exc, ServiceError):
        logger.error("unexpected error in %s", what, exc_info=exc)


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


# Model names are folder names of the repository, which no file system lets be longer than 255
# (bytes; so characters too): a longer name in a request cannot name a model. It is refused here,
# before the repository quotes it whole in its NOT_FOUND message.
MAX_NAME_CHARS = 255


def model_name(name: str) -> str | None:
    """A request's model name for ModelRepository.get ("" -> None: the default model);
    ModelNotFoundError, quoting it shortened, for a name too long to be a model's."""
    if len(name) > MAX_NAME_CHARS:
        raise ModelNotFoundError(f"no model named {shown(name)}")
    return name or None


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


class Seen:
    """What an observed request learnt on its way: the model it reached (its metrics label),
    and for tracing and the access log its version, texts and result; `trace` is the request's
    trace (pass it to ModelHandle.classify) when tracing is on."""

    __slots__ = ("model", "result", "texts", "trace", "version")

    def __init__(self, model: str) -> None:
        self.model = model
        self.version: int | None = None
        self.texts: Sequence[str] | None = None
        self.result: ClassifyResult | None = None
        self.trace: RequestTrace | None = None

    def reached(self, name: str, version: int, texts: Sequence[str]) -> None:
        """The request reached `version` of model `name` with `texts`."""
        self.model = name
        self.version = version
        self.texts = texts


class Observation:
    """One request being observed, for code that cannot hold a `with` block open across its
    request (a stream's messages finish in callbacks): `observed()` is this as a context
    manager. Build it when the request arrives, call `finish(exc)` exactly once when it ends
    (None: it succeeded). `seen` is what the request learnt on its way."""

    __slots__ = ("_context", "_deadline", "_method", "_metrics", "_started", "_telemetry", "seen")

    def __init__(
        self,
        metrics: Metrics | None,
        method: str,
        deadline: float | None,
        model: str = "",
        *,
        context: Any = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._started = time.perf_counter()
        self._metrics = metrics
        self._method = method
        self._deadline = deadline
        self._context = context
        self.seen = seen = Seen(model)
        if telemetry is not None and telemetry.tracing is None and telemetry.access_log is None:
            telemetry = None  # both off: nothing more to do than the metrics
        self._telemetry = telemetry
        if telemetry is not None and telemetry.tracing is not None:
            seen.trace = telemetry.tracing.start_request(
                method, None if context is None else context.invocation_metadata()
            )

    def finish(self, exc: BaseException | None) -> None:
        """Count the request with the code its outcome `exc` has, end its span, log it."""
        code = "OK"
        if isinstance(exc, asyncio.CancelledError):
            expired = self._deadline is not None and time.monotonic() >= self._deadline
            code = "DEADLINE_EXCEEDED" if expired else "CANCELLED"
        elif isinstance(exc, Exception):
            code = code_name(exc)
        seconds = time.perf_counter() - self._started
        exemplar = None
        if self._telemetry is not None:
            exemplar = _report(
                self._telemetry, self.seen, self._method, code, seconds, self._context
            )
        if self._metrics is not None:
            self._metrics.observe_request(self._method, self.seen.model, code, seconds, exemplar)


@contextlib.contextmanager
def observed(
    metrics: Metrics | None,
    method: str,
    deadline: float | None,
    model: str = "",
    *,
    context: Any = None,
    telemetry: Telemetry | None = None,
) -> Iterator[Seen]:
    """Count one request in `textserve_request_duration_seconds` with its final status code.

    `model` is the name asked for (an unknown one is counted as one label value by the
    metrics); set `seen.model` once the request reached a model. A handler cancelled by grpc
    counts as DEADLINE_EXCEEDED when the caller's deadline has passed (grpc cancels the handler
    then too), else as CANCELLED; an exception counts with its code from the table above.

    With `telemetry` (and the call's `context` for its metadata and peer: a grpc context, or
    anything with its `invocation_metadata()` and `peer()`) the request is also traced (its
    span, parent: the caller's traceparent; a sampled one's trace id becomes the latency
    bucket's exemplar) and access-logged, each only when it is on."""
    observation = Observation(
        metrics, method, deadline, model, context=context, telemetry=telemetry
    )
    try:
        yield observation.seen
    except BaseException as exc:
        observation.finish(exc)
        raise
    observation.finish(None)


def _report(
    telemetry: Telemetry, seen: Seen, method: str, code: str, seconds: float, context: Any
) -> dict[str, str] | None:
    """End the request's span and write its access log line; the exemplar of a sampled
    request. Never raises: observing a request must not change its outcome."""
    result, trace = seen.result, seen.trace
    # A name that reached no model is the caller's text: never megabytes of it in a log line.
    # (A model's own name is a folder's, never longer than the cut: it is kept whole.)
    model = seen.model[:MAX_NAME_CHARS]
    tokens = None if result is None else int(result.num_tokens.sum())
    timings = None if result is None else result.timings
    cached = None if result is None or result.cached is None else result.cached_count
    # Each report on its own: a span that fails to end must not cost the access-log line.
    if trace is not None:
        try:
            trace.finish(
                code,
                model=model,
                version=seen.version,
                texts=None if seen.texts is None else len(seen.texts),
                tokens=tokens,
                timings=timings,
                cached=cached,
            )
        except Exception:
            logger.exception("tracing a %s request failed", method)
    access_log = telemetry.access_log
    if access_log is not None:
        try:
            access_log.write(
                method=method,
                peer="" if context is None else context.peer(),
                model=model,
                version=seen.version,
                texts=seen.texts,
                tokens=tokens,
                status=code,
                timings=timings,
                seconds=seconds,
                trace_id=None if trace is None else trace.trace_id,
                cached=cached,
            )
        except Exception:
            logger.exception("access-logging a %s request failed", method)
    return {"trace_id": trace.trace_id} if trace is not None and trace.sampled else None
