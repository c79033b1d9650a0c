"""OpenTelemetry tracing of requests and batches (off unless --otlp-endpoint is given).

    tracing = Tracing("http://127.0.0.1:4317", sample_ratio=0.1, metrics=metrics)
    trace = tracing.start_request("Classify", context.invocation_metadata())  # or None
    ...                                        # the engine links its batch span to `trace`
    trace.finish("OK", model="default", version=3, texts=2, tokens=17, timings=result.timings)
    tracing.shutdown()

The SDK is imported here only, and only when tracing is on: a server without --otlp-endpoint
never imports opentelemetry, and its requests never reach this module. A request span is a
SERVER span whose parent is the caller's W3C `traceparent` (gRPC metadata; a malformed one is
ignored and the request starts its own trace); sampled requests get events for the start of
their queue wait, tokenization and inference (with each stage's length), reconstructed from
the timings the engine measured.
Each batch that carried a sampled request gets a span of its own (a trace of its own) linked to
every sampled request in it, with the batch's size, tokens, padding, model, version and
provider; a batch span is always kept when a linked request was.

Export is the SDK's BatchSpanProcessor and OTLP/gRPC exporter, on their own thread: an
unreachable endpoint never fails or slows a request. Spans that cannot be exported are dropped,
counted in textserve_trace_spans_dropped_total and said once in the log (again only after an
export succeeded in between). No grpc here: the engine calls RequestTrace.on_batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from textserve.service.engine.batcher import RunStats
    from textserve.service.engine.handle import Timings
    from textserve.service.metrics import Metrics

logger = logging.getLogger(__name__)

TRACEPARENT = "traceparent"  # W3C trace context, as gRPC metadata keys (lower case)
TRACESTATE = "tracestate"
# Seconds the exporter may spend on one batch of spans (retries included): an unreachable
# endpoint holds the export thread this long, never a request.
EXPORT_TIMEOUT = 5.0
# Seconds shutdown waits for the last spans to be exported.
SHUTDOWN_TIMEOUT = 2.0
# Finished spans held for export (the SDK's default is 2048): a second of a busy server's
# sampled requests (5 spans each) at 100 % sampling; beyond it spans are dropped, not queued.
MAX_QUEUED_SPANS = 16384
# The SDK's loggers, quiet: a down endpoint would log every export and every dropped span.
_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
)
_SERVICES = {
    "Classify": "textserve.v1.Classifier",
    "ClassifyStream": "textserve.v1.Classifier",
    "ModelInfer": "inference.GRPCInferenceService",
}


def _wall_ns(seconds_ago: float) -> int:
    """Epoch nanoseconds `seconds_ago` seconds before now (spans are on the wall clock)."""
    return time.time_ns() - int(seconds_ago * 1e9)


class Tracing:
    """The server's tracer provider (not the process-global one), sampler and exporter."""

    def __init__(
        self,
        endpoint: str,
        sample_ratio: float,
        *,
        metrics: Metrics | None = None,
        service_name: str = "textserve",
        export_timeout: float = EXPORT_TIMEOUT,
        schedule_delay: float = 1.0,
    ) -> None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        for name in _SDK_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        self.endpoint = endpoint
        self.sample_ratio = sample_ratio
        self._metrics = metrics
        exporter = OTLPSpanExporter(
            endpoint=endpoint, insecure=not endpoint.startswith("https://"), timeout=export_timeout
        )
        self._exporter = _CountingExporter(exporter, self)
        self._processor = _CountingProcessor(
            self._exporter,
            self,
            schedule_delay_millis=schedule_delay * 1000,
            max_queue_size=MAX_QUEUED_SPANS,
        )
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": service_name}),
            sampler=_sampler(sample_ratio),
        )
        self._provider.add_span_processor(self._processor)
        self.tracer = self._provider.get_tracer("textserve")
        self._propagator = TraceContextTextMapPropagator()
        self._failing = False
        self._queue_full_said = False
        self._lock = threading.Lock()

    # -- requests --------------------------------------------------------------------------

    def start_request(
        self, method: str, metadata: Iterable[tuple[str, Any]] | None
    ) -> RequestTrace:
        """Start the span of one request, child of the caller's `traceparent` if valid."""
        from opentelemetry.trace import SpanKind

        carrier = {}
        for key, value in metadata or ():
            if key in (TRACEPARENT, TRACESTATE) and isinstance(value, str):
                carrier[key] = value
        parent = self._propagator.extract(carrier) if carrier else None
        span = self.tracer.start_span(
            method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "rpc.system": "grpc",
                "rpc.service": _SERVICES.get(method, ""),
                "rpc.method": method,
            },
        )
        return RequestTrace(self, span)

    # -- export accounting -------------------------------------------------------------------

    def dropped(self, reason: str, spans: int, why: str) -> None:
        if self._metrics is not None:
            self._metrics.count_dropped_spans(reason, spans)
        with self._lock:
            if reason == "queue_full":  # said once: the counter tells how often since
                first, self._queue_full_said = not self._queue_full_said, True
            else:  # once per outage of the endpoint, not once per span or export
                first, self._failing = not self._failing, True
        if first:
            logger.warning(
                "tracing: dropping spans, the OTLP endpoint %s %s (counted in "
                "textserve_trace_spans_dropped_total; requests are not affected)",
                self.endpoint,
                why,
            )

    def exported(self) -> None:
        if self._failing:
            with self._lock:
                self._failing = False
            logger.info("tracing: exporting to %s again", self.endpoint)

    def flush(self) -> None:
        """Blocking: export every finished span now (tests, benchmarks)."""
        self._processor.force_flush()

    def shutdown(self, timeout: float = SHUTDOWN_TIMEOUT) -> None:
        """Blocking: export what is left within `timeout` seconds, then stop (idempotent)."""
        self._processor.shutdown(timeout_millis=int(timeout * 1000))


class RequestTrace:
    """One request's span; `sampled` requests also get stage events and a batch span link."""

    __slots__ = ("_tracing", "sampled", "span", "trace_id")

    def __init__(self, tracing: Tracing, span: Any) -> None:
        self._tracing = tracing
        self.span = span
        context = span.get_span_context()
        self.sampled: bool = span.is_recording()
        self.trace_id: str = format(context.trace_id, "032x")

    def finish(
        self,
        code: str,
        *,
        model: str,
        version: int | None,
        texts: int | None,
        tokens: int | None,
        timings: Timings | None,
        cached: int | None = None,
    ) -> None:
        """End the request's span with what it learnt (a no-op when not sampled). `cached`:
        how many of its texts the response cache answered (None: the model has no cache)."""
        if not self.sampled:
            return
        from opentelemetry.trace import Status, StatusCode

        span = self.span
        attributes: dict[str, str | int] = {"rpc.grpc.status_code": code}
        if model:
            attributes["textserve.model"] = model
        if version is not None:
            attributes["textserve.model.version"] = version
        if texts is not None:
            attributes["textserve.texts"] = texts
        if tokens is not None:
            attributes["textserve.tokens"] = tokens
        if cached is not None:
            attributes["textserve.cached"] = cached
        span.set_attributes(attributes)  # one call: each takes the span's lock
        if timings is not None:
            self._stages(timings)
        if code != "OK":
            span.set_status(Status(StatusCode.ERROR, code))
        span.end()

    def _stages(self, timings: Timings) -> None:
        """An event at the start of each stage, laid back to back ending now, with its length:
        queue (the wait for a batch), tokenize (the request's batch), inference (its
        onnxruntime runs). Events, not child spans: a span costs ~25 µs of the event loop's
        CPU, an event a tenth of that."""
        span = self.span
        end = time.time_ns()
        for name, seconds in (
            ("inference", timings.inference_seconds),
            ("tokenize", timings.tokenize_seconds),
            ("queue", timings.queue_seconds),
        ):
            start = end - int(seconds * 1e9)
            span.add_event(name, {"textserve.seconds": seconds}, timestamp=start)
            end = start

    def on_batch(
        self,
        traces: Sequence[Any],  # RequestTrace (typed as the engine's BatchTrace protocol)
        started_ago: float,
        seconds: float,
        runs: Sequence[RunStats],
        attributes: Mapping[str, str | int],
    ) -> None:
        """The engine's call for a batch that carried `traces` (this one among them): its span,
        linked to each of them, `started_ago` seconds ago and `seconds` long."""
        from opentelemetry.trace import Link

        links = [Link(t.span.get_span_context()) for t in traces if t.sampled]
        if not links:
            return
        size = sum(run.size for run in runs)
        padded = sum(run.padded_tokens for run in runs)
        real = sum(run.real_tokens for run in runs)
        start = _wall_ns(started_ago)
        span = self._tracing.tracer.start_span(
            "batch",
            links=links,
            start_time=start,
            attributes={
                **attributes,
                "textserve.batch.size": size,
                "textserve.batch.requests": len(links),
                "textserve.batch.runs": len(runs),
                "textserve.batch.tokens": padded,
                "textserve.batch.real_tokens": real,
                "textserve.batch.padding_ratio": 1.0 - real / padded if padded else 0.0,
                "textserve.batch.inference_seconds": sum(run.seconds for run in runs),
            },
        )
        span.end(end_time=start + int(seconds * 1e9))


def _sampler(ratio: float) -> Any:
    """The caller's decision when it sent one (ParentBased), else `ratio` of the traces; a span
    with links (a batch span, linked only to sampled requests) is always kept."""
    from opentelemetry.sdk.trace.sampling import (
        Decision,
        ParentBased,
        Sampler,
        SamplingResult,
        TraceIdRatioBased,
    )

    class _BatchesKept(Sampler):
        def __init__(self, inner: Sampler) -> None:
            self._inner = inner

        def should_sample(
            self,
            parent_context: Any,
            trace_id: int,
            name: str,
            kind: Any = None,
            attributes: Any = None,
            links: Any = None,
            trace_state: Any = None,
        ) -> SamplingResult:
            if links:
                return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
            return self._inner.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return f"BatchesKept{{{self._inner.get_description()}}}"

    return _BatchesKept(ParentBased(TraceIdRatioBased(ratio)))


class _CountingExporter:
    """The OTLP exporter, counting what it fails to export (SpanExporter's interface)."""

    def __init__(self, inner: Any, tracing: Tracing) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self._inner = inner
        self._tracing = tracing
        self._ok = SpanExportResult.SUCCESS
        self._failure = SpanExportResult.FAILURE

    def export(self, spans: Sequence[Any]) -> Any:
        try:
            result = self._inner.export(spans)
        except Exception as exc:
            result, why = self._failure, f"failed ({exc!r})"
        else:
            why = "cannot be reached or refused them"
        if result == self._ok:
            self._tracing.exported()
        else:
            self._tracing.dropped("export_failed", len(spans), why)
        return result

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))


def _CountingProcessor(exporter: Any, tracing: Tracing, **options: Any) -> Any:
    """A BatchSpanProcessor that counts the spans it drops because its queue is full."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    class Counting(BatchSpanProcessor):
        def on_end(self, span: Any) -> None:
            queue = getattr(getattr(self, "_batch_processor", None), "_queue", None)
            if queue is not None and queue.maxlen is not None and len(queue) >= queue.maxlen:
                tracing.dropped("queue_full", 1, "is slower than the traffic (queue full)")
            super().on_end(span)

        def shutdown(self, timeout_millis: int = 30_000) -> None:
            # BatchSpanProcessor.shutdown() waits up to 30 s for a down endpoint; its inner
            # batch processor takes the bound (the public method, if that ever goes).
            inner = getattr(self, "_batch_processor", None)
            if inner is not None and hasattr(inner, "shutdown"):
                inner.shutdown(timeout_millis=timeout_millis)
            else:
                super().shutdown()

    return Counting(exporter, **options)
