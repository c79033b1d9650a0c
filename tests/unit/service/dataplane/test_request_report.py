"""What an operator sees of one observed request (service/servicers/status.py `observed()`).

With tracing on, the request's span ends with its status and what it learnt (model, version,
texts, tokens, the stages' timings); with the access log on, one JSON line says the same with
the method, peer, status, seconds and trace id; a sampled request's trace id is the exemplar
of its latency bucket. A name that reached no model is cut to the name limit, and a trace or
access log that fails is logged and never changes the request's outcome. A request the
response cache answered says how many of its texts were cached; one without a cache, nothing.
Real pieces throughout: the OpenTelemetry SDK (an in-memory exporter behind the server's
Tracing), the server's AccessLog and Metrics on a registry of their own.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry

from textserve.service.access_log import AccessLog
from textserve.service.dataplane.context import Telemetry
from textserve.service.dataplane.observe import Seen, observed
from textserve.service.dataplane.prologue import MAX_NAME_CHARS
from textserve.service.engine.handle import ClassifyResult, Timings
from textserve.service.errors import ModelNotFoundError, ValidationError
from textserve.service.metrics import UNKNOWN_MODEL, Metrics
from textserve.service.tracing import RequestTrace, Tracing

PEER = "ipv4:10.0.0.7:5123"
TIMINGS = Timings(
    queue_seconds=0.002, tokenize_seconds=0.001, inference_seconds=0.004, total_seconds=0.008
)
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


class Call:
    """The grpc call context as observed() uses it: its metadata and its peer."""

    def __init__(self, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self._metadata = tuple(metadata)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return PEER


@dataclass
class Observer:
    """One server's observation: its metrics, telemetry, the spans it exported and its lines."""

    metrics: Metrics
    telemetry: Telemetry
    exporter: InMemorySpanExporter
    lines: list[str]

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def line(self) -> dict[str, Any]:
        (line,) = self.lines
        parsed: dict[str, Any] = json.loads(line)
        return parsed

    def exemplars(self) -> list[tuple[dict[str, str], float]]:
        """The latency histogram's exemplars: (labels, value) of each."""
        return [
            (dict(sample.exemplar.labels), sample.exemplar.value)
            for family in self.metrics.registry.collect()
            if family.name == "textserve_request_duration_seconds"
            for sample in family.samples
            if sample.exemplar is not None
        ]

    def seconds(self, model: str, code: str) -> float | None:
        """The latency histogram's sum for (Classify, model, code): the request's seconds."""
        return self.metrics.registry.get_sample_value(
            "textserve_request_duration_seconds_sum",
            {"method": "Classify", "model": model, "code": code},
        )


@pytest.fixture
def tracing() -> Iterator[Tracing]:
    """The server's Tracing, its endpoint never reached: the spans go to the test's tracer."""
    tracing = Tracing("http://127.0.0.1:9", 1.0)
    yield tracing
    tracing.shutdown(timeout=0.1)


def observer(
    tracing: Tracing | None, *, sampled: bool = True, access_log: bool = True, fail: bool = False
) -> Observer:
    """Tracing (every trace sampled, or only those a caller's traceparent samples) and the
    access log (`fail`: its every line fails to be written), each when given."""
    exporter = InMemorySpanExporter()
    if tracing is not None:
        provider = TracerProvider(sampler=ALWAYS_ON if sampled else ParentBased(ALWAYS_OFF))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracing.tracer = provider.get_tracer("test")
    lines: list[str] = []

    def emit(line: str) -> None:
        if fail:
            raise OSError("stdout is gone")
        lines.append(line)

    metrics = Metrics(CollectorRegistry())
    metrics.init_model("m")
    log = AccessLog(metrics=metrics, emit=emit) if access_log else None
    return Observer(metrics, Telemetry(tracing=tracing, access_log=log), exporter, lines)


def result() -> ClassifyResult:
    """What classifying two texts of 5 and 7 tokens answered."""
    return ClassifyResult(
        probabilities=np.full((2, 2), 0.5, dtype=np.float32),
        num_tokens=np.array([5, 7], dtype=np.int64),
        truncated=np.zeros(2, dtype=bool),
        timings=TIMINGS,
    )


def serve(obs: Observer, context: Any = None, *, name: str = "m") -> Seen:
    """One Classify request that reaches version 3 of model `name` with two texts."""
    with observed(
        obs.metrics, "Classify", None, name, context=context, telemetry=obs.telemetry
    ) as seen:
        seen.reached(name, 3, ["first text", "second"])
        seen.result = result()
    return seen


def fail(obs: Observer, exc: Exception, name: str, context: Any = None) -> None:
    """One Classify request for `name` that raises `exc` before reaching a model."""
    telemetry = obs.telemetry
    with (
        pytest.raises(type(exc)) as raised,
        observed(obs.metrics, "Classify", None, name, context=context, telemetry=telemetry),
    ):
        raise exc
    assert raised.value is exc  # the request's own outcome, untouched by its observation


def test_a_served_request_ends_its_span_with_what_it_learnt(tracing: Tracing) -> None:
    obs = observer(tracing)
    seen = serve(obs, Call())
    (span,) = obs.spans()
    assert seen.trace is not None and seen.trace.sampled
    assert span.context.trace_id == int(seen.trace.trace_id, 16)
    assert span.name == "Classify" and span.end_time is not None
    assert span.status.status_code is StatusCode.UNSET  # OK: not an error
    assert dict(span.attributes or {}) == {
        "rpc.system": "grpc",
        "rpc.service": "textserve.v1.Classifier",
        "rpc.method": "Classify",
        "rpc.grpc.status_code": "OK",
        "textserve.model": "m",
        "textserve.model.version": 3,
        "textserve.texts": 2,
        "textserve.tokens": 12,
    }
    # the stages the engine timed, back to back: queue, tokenize, inference
    stages = sorted(span.events, key=lambda event: event.timestamp)
    assert [(e.name, dict(e.attributes or {})) for e in stages] == [
        ("queue", {"textserve.seconds": 0.002}),
        ("tokenize", {"textserve.seconds": 0.001}),
        ("inference", {"textserve.seconds": 0.004}),
    ]


def test_a_served_request_writes_its_access_log_line(tracing: Tracing) -> None:
    obs = observer(tracing)
    seen = serve(obs, Call())
    line = obs.line()
    seconds = obs.seconds("m", "OK")
    assert seen.trace is not None and seconds is not None and seconds > 0
    assert line.pop("time")
    assert line == {
        "peer": PEER,
        "method": "Classify",
        "model": "m",
        "version": 3,
        "texts": 2,
        "tokens": 12,
        "status": "OK",
        "queue_ms": 2.0,
        "tokenize_ms": 1.0,
        "inference_ms": 4.0,
        "total_ms": round(seconds * 1e3, 3),  # the seconds the metrics counted
        "trace_id": seen.trace.trace_id,
    }


def test_a_sampled_requests_trace_id_is_its_latency_exemplar(tracing: Tracing) -> None:
    obs = observer(tracing)
    seen = serve(obs, Call())
    assert seen.trace is not None
    assert obs.exemplars() == [({"trace_id": seen.trace.trace_id}, obs.seconds("m", "OK"))]


def test_an_unsampled_request_has_no_span_nor_exemplar_but_its_line_has_its_trace_id(
    tracing: Tracing,
) -> None:
    obs = observer(tracing, sampled=False)
    seen = serve(obs, Call())
    assert seen.trace is not None and not seen.trace.sampled
    assert obs.spans() == [] and obs.exemplars() == []
    trace_id = obs.line()["trace_id"]
    assert trace_id == seen.trace.trace_id and len(trace_id) == 32 and int(trace_id, 16)


def test_a_request_sampled_by_its_caller_joins_the_callers_trace(tracing: Tracing) -> None:
    obs = observer(tracing, sampled=False)  # only a caller's sampled traceparent is kept
    serve(obs, Call([("traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")]))
    (span,) = obs.spans()
    assert span.parent is not None and format(span.parent.span_id, "016x") == CALLER_SPAN
    assert format(span.context.trace_id, "032x") == CALLER_TRACE
    assert obs.line()["trace_id"] == CALLER_TRACE
    assert obs.exemplars() == [({"trace_id": CALLER_TRACE}, obs.seconds("m", "OK"))]


def test_a_name_that_reached_no_model_is_reported_cut_to_the_name_limit(
    tracing: Tracing, caplog: pytest.LogCaptureFixture
) -> None:
    obs = observer(tracing)
    name = "n" * (MAX_NAME_CHARS + 100)
    fail(obs, ModelNotFoundError("no model named n…"), name, Call())
    (span,) = obs.spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "NOT_FOUND"
    attributes = dict(span.attributes or {})
    assert attributes["rpc.grpc.status_code"] == "NOT_FOUND"
    assert attributes["textserve.model"] == "n" * MAX_NAME_CHARS
    # no version, texts, tokens nor stages: it reached none
    assert not {"textserve.model.version", "textserve.texts", "textserve.tokens"} & set(attributes)
    assert span.events == ()
    line = obs.line()
    assert line["model"] == "n" * MAX_NAME_CHARS and line["status"] == "NOT_FOUND"
    assert (line["version"], line["texts"], line["tokens"]) == (None, None, None)
    assert (line["queue_ms"], line["tokenize_ms"], line["inference_ms"]) == (None, None, None)
    assert line["total_ms"] is not None
    assert line["trace_id"] == format(span.context.trace_id, "032x")
    assert obs.seconds(UNKNOWN_MODEL, "NOT_FOUND") is not None  # counted, under one label
    assert caplog.records == []


def test_a_reached_models_name_is_kept_whole(tracing: Tracing) -> None:
    obs = observer(tracing)
    name = "m" * MAX_NAME_CHARS  # as long as a folder's name can be
    serve(obs, Call(), name=name)
    (span,) = obs.spans()
    assert (span.attributes or {})["textserve.model"] == name
    assert obs.line()["model"] == name


def test_a_request_for_the_default_model_that_reached_none_names_no_model(
    tracing: Tracing,
) -> None:
    obs = observer(tracing)
    fail(obs, ValidationError("no texts"), "", Call())
    (span,) = obs.spans()
    assert "textserve.model" not in (span.attributes or {})
    line = obs.line()
    assert (line["model"], line["status"]) == (None, "INVALID_ARGUMENT")


def test_with_the_access_log_alone_the_line_has_no_trace_and_no_peer_without_a_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    obs = observer(None)
    seen = serve(obs)
    assert seen.trace is None
    line = obs.line()
    assert (line["peer"], line["trace_id"]) == ("", None)
    assert (line["model"], line["version"], line["texts"], line["tokens"]) == ("m", 3, 2, 12)
    assert obs.exemplars() == []
    fail(obs, ValidationError("no texts"), "m")
    assert json.loads(obs.lines[1])["status"] == "INVALID_ARGUMENT"
    assert caplog.records == []


def test_with_tracing_alone_only_the_span_is_ended(
    tracing: Tracing, caplog: pytest.LogCaptureFixture
) -> None:
    obs = observer(tracing, access_log=False)
    serve(obs, Call())
    (span,) = obs.spans()
    assert (span.attributes or {})["textserve.model.version"] == 3
    assert obs.lines == [] and len(obs.exemplars()) == 1
    assert caplog.records == []


@pytest.mark.parametrize(("deadline", "code"), [(0.0, "DEADLINE_EXCEEDED"), (None, "CANCELLED")])
def test_a_cancelled_request_is_reported_with_its_code(
    tracing: Tracing, deadline: float | None, code: str
) -> None:
    obs = observer(tracing)
    with (
        pytest.raises(asyncio.CancelledError),
        observed(
            obs.metrics, "Classify", deadline, "m", context=Call(), telemetry=obs.telemetry
        ) as seen,
    ):
        seen.reached("m", 3, ["text"])
        raise asyncio.CancelledError
    (span,) = obs.spans()
    assert (span.status.status_code, span.status.description) == (StatusCode.ERROR, code)
    line = obs.line()
    assert (line["status"], line["texts"], line["tokens"]) == (code, 1, None)


def failure_logged(caplog: pytest.LogCaptureFixture, error: type[BaseException], what: str) -> None:
    """One line says `what` (tracing, access-logging) of a Classify request failed, with the
    traceback."""
    (record,) = caplog.records
    assert record.name == "textserve.service.dataplane.observe"
    assert record.levelno == logging.ERROR
    assert record.getMessage() == f"{what} a Classify request failed"
    assert record.exc_info is not None and record.exc_info[0] is error


def test_a_failing_access_log_is_logged_and_changes_no_outcome(
    tracing: Tracing, caplog: pytest.LogCaptureFixture
) -> None:
    obs = observer(tracing, fail=True)
    seen = serve(obs, Call())  # answered as if nothing happened
    failure_logged(caplog, OSError, "access-logging")
    assert len(obs.spans()) == 1  # the trace was ended before the line failed
    assert seen.trace is not None
    assert obs.exemplars() == [({"trace_id": seen.trace.trace_id}, obs.seconds("m", "OK"))]
    caplog.clear()
    fail(obs, ValidationError("no texts"), "m", Call())  # its own error, not the log's
    failure_logged(caplog, OSError, "access-logging")
    assert obs.seconds("m", "INVALID_ARGUMENT") is not None


def test_a_failing_trace_is_logged_and_still_access_logged_and_changes_no_outcome(
    tracing: Tracing, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: RequestTrace, code: str, **learnt: Any) -> None:
        raise RuntimeError("the span is gone")

    monkeypatch.setattr(RequestTrace, "finish", broken)
    obs = observer(tracing)
    serve(obs, Call())
    failure_logged(caplog, RuntimeError, "tracing")
    assert obs.seconds("m", "OK") is not None  # counted all the same
    assert obs.line()["status"] == "OK"  # the access log does not depend on the span
    caplog.clear()
    obs.lines.clear()
    fail(obs, ModelNotFoundError("no model named x"), "x", Call())
    failure_logged(caplog, RuntimeError, "tracing")
    assert obs.line()["status"] == "NOT_FOUND"


# -- a request the response cache answered -----------------------------------------------------


def answer(cached: np.ndarray | None) -> ClassifyResult:
    return ClassifyResult(
        probabilities=np.full((3, 2), 0.5, dtype=np.float32),
        num_tokens=np.array([5, 7, 2], dtype=np.int64),
        truncated=np.zeros(3, dtype=bool),
        timings=TIMINGS,
        cached=cached,
    )


def test_the_span_and_the_access_log_say_how_many_texts_were_cached(tracing: Tracing) -> None:
    for cached, said in ((np.array([True, False, True]), 2), (None, None)):
        obs = observer(tracing)
        with observed(
            obs.metrics, "Classify", None, "m", context=Call(), telemetry=obs.telemetry
        ) as seen:
            seen.reached("m", 3, ["first text", "second", "third"])
            seen.result = answer(cached)
        (span,) = obs.spans()
        assert (span.attributes or {}).get("textserve.cached") == said
        assert obs.line().get("cached") == said
        assert ("cached" in obs.line()) is (said is not None)
