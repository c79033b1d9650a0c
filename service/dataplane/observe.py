"""Request observation, for every front end: the request counted with its final code, traced and
access-logged, whichever transport it came by.

    with observed(metrics, "Classify", deadline, context=context, telemetry=telemetry) as seen:
        handle = resolve(repository, model, version)
        seen.reached(handle.name, handle.version, texts)
        seen.result = await handle.classify(texts, ...)

`context` is anything with `invocation_metadata()` (the trace's parent) and `peer()` (the access
log): a grpc context, or an HTTP request. Nothing here imports a transport.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from textserve.service.dataplane.codes import code_name
from textserve.service.dataplane.prologue import MAX_NAME_CHARS
from textserve.service.errors import LimitExceededError

if TYPE_CHECKING:
    from textserve.service.dataplane.context import Telemetry
    from textserve.service.engine.handle import ClassifyResult
    from textserve.service.metrics import Metrics
    from textserve.service.tracing import RequestTrace

logger = logging.getLogger(__name__)


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
    """One request being observed: counted in `textserve_request_duration_seconds` with its
    final status code. Build it when the request arrives and use it as a context manager
    (`observed`), or, for code that cannot hold a `with` block open across its request (a
    stream's messages finish in callbacks), call `finish(exc)` exactly once when it ends (None:
    it succeeded). `seen` is what the request learnt on its way.

    `model` is the name asked for (an unknown one is counted as one label value by the
    metrics); set `seen.model` once the request reached a model. A handler cancelled by grpc
    counts as DEADLINE_EXCEEDED when the caller's deadline has passed (grpc cancels the handler
    then too), else as CANCELLED; an exception counts with its code from dataplane/codes.py.

    With `telemetry` (and the call's `context` for its metadata and peer: a grpc context, or
    anything with its `invocation_metadata()` and `peer()`) the request is also traced (its
    span, parent: the caller's traceparent; a sampled one's trace id becomes the latency
    bucket's exemplar) and access-logged, each only when it is on."""

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
            if isinstance(exc, LimitExceededError) and self._metrics is not None:
                self._metrics.limit_refusals.labels(self._method, exc.limit).inc()
        seconds = time.perf_counter() - self._started
        exemplar = None
        if self._telemetry is not None:
            exemplar = _report(
                self._telemetry, self.seen, self._method, code, seconds, self._context
            )
        if self._metrics is not None:
            self._metrics.observe_request(self._method, self.seen.model, code, seconds, exemplar)

    # The context manager form (observed()): a class's __enter__/__exit__ rather than a
    # contextlib generator, which costs a generator and two next() calls per request.
    def __enter__(self) -> Seen:
        return self.seen

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        self.finish(exc)


# The context manager form, for code that holds a `with` block open across its request:
#     with observed(metrics, "Classify", deadline, context=context, telemetry=t) as seen: ...
observed = Observation


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
