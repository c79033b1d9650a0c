"""Client.classify_stream carries the caller's trace context (traceparent) as Client.classify
does: the server's spans for the stream's messages are children of the caller's span."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

from tests.handmade import make_version
from tests.otlp import otlp_receiver
from tests.serving import running_server
from textserve.client import Client

MODEL = "handmade"
SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER


def test_classify_stream_sends_the_callers_traceparent(tmp_path: Path) -> None:
    make_version(tmp_path, MODEL, 1)
    provider = TracerProvider()  # the caller's own SDK (not exported anywhere)
    with (
        otlp_receiver() as receiver,
        running_server(tmp_path, otlp_endpoint=receiver.endpoint, trace_sample_ratio=1.0) as srv,
    ):
        with (
            provider.get_tracer("caller").start_as_current_span("caller") as span,
            Client(srv.address) as client,
        ):
            results = list(client.classify_stream(["a good film", "a bad film"]))
            caller = span.get_span_context()
        assert len(results) == 2
        tracing = srv.server.ctx.telemetry.tracing
        assert tracing is not None
        tracing.flush()
        spans = receiver.wait_for(lambda s: len([x for x in s if x.kind == SERVER_KIND]) >= 2)
    streamed = [s for s in spans if s.kind == SERVER_KIND and s.name == "ClassifyStream"]
    assert len(streamed) == 2
    assert {(s.trace_id, s.parent_span_id) for s in streamed} == {
        (format(caller.trace_id, "032x"), format(caller.span_id, "016x"))
    }
