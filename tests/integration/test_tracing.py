"""OpenTelemetry tracing exported over real OTLP/gRPC to a receiver in the test (tests/otlp.py):
a span per request (child of the caller's traceparent when one is sent, on both APIs and from
our client) with an event per stage, one span per batch linked to every request it carried;
nothing at all when tracing is off; an unreachable endpoint neither fails nor slows requests;
a malformed traceparent is ignored."""

from __future__ import annotations

import logging
import socket
import statistics
import time
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider

from tests.handmade import make_version
from tests.otlp import Span, otlp_receiver
from tests.serving import RunningServer, running_server
from textserve.client import Client
from textserve.oip import grpc_service_pb2 as oip
from textserve.oip import grpc_service_pb2_grpc as oip_grpc
from textserve.service.tracing import Tracing
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

MODEL = "handmade"
SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER
CALLER_A = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
CALLER_B = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")


def traceparent(trace_id: str, span_id: str, flags: str = "01") -> tuple[tuple[str, str], ...]:
    return (("traceparent", f"00-{trace_id}-{span_id}-{flags}"),)


def classify(
    channel: grpc.Channel, text: str, metadata: tuple[tuple[str, str], ...] = ()
) -> grpc.Future:
    stub = pb_grpc.ClassifierStub(channel)
    return stub.Classify.future(pb.ClassifyRequest(texts=[text]), timeout=30, metadata=metadata)


def model_infer(
    channel: grpc.Channel, text: str, metadata: tuple[tuple[str, str], ...]
) -> grpc.Future:
    request = oip.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(text.encode())
    stub = oip_grpc.GRPCInferenceServiceStub(channel)
    return stub.ModelInfer.future(request, timeout=30, metadata=metadata)


def requests_of(spans: list[Span]) -> list[Span]:
    return [s for s in spans if s.kind == SERVER_KIND]


def flush(srv: RunningServer) -> None:
    tracing = srv.server.ctx.telemetry.tracing
    assert tracing is not None
    tracing.flush()


def test_one_trace_per_request_and_a_batch_span_linked_to_all(tmp_path: Path) -> None:
    make_version(tmp_path, MODEL, 1)
    with (
        otlp_receiver() as receiver,
        running_server(tmp_path, otlp_endpoint=receiver.endpoint, trace_sample_ratio=1.0) as srv,
    ):
        handle = srv.server.repository.get()
        channel = srv.channel()
        srv.call(handle.batcher.pause)  # the four requests queue, then run as one batch
        calls = [
            classify(channel, "a good film", traceparent(*CALLER_A)),
            classify(channel, "a bad film"),  # no traceparent: a trace of its own
            classify(channel, "good good", traceparent(*CALLER_B)),
            model_infer(channel, "bad", traceparent(*CALLER_B[:1], "1111111111111111")),
        ]
        deadline = time.monotonic() + 30
        while handle.stats().queue_depth < 4:  # polling, not a readiness guess
            assert time.monotonic() < deadline, "the requests never queued"
            time.sleep(0.01)
        srv.call(handle.batcher.resume)
        for call in calls:
            call.result()
        flush(srv)
        spans = receiver.wait_for(
            lambda s: len(requests_of(s)) == 4 and any(x.name == "batch" for x in s)
        )

    requests = requests_of(spans)
    assert sorted(s.name for s in requests) == ["Classify", "Classify", "Classify", "ModelInfer"]
    assert {s.service for s in spans} == {"textserve"}
    by_parent = {s.parent_span_id: s for s in requests}
    # the caller's trace id and span (as parent) when sent, on both APIs
    assert by_parent[CALLER_A[1]].trace_id == CALLER_A[0]
    assert by_parent[CALLER_B[1]].trace_id == CALLER_B[0]
    assert by_parent["1111111111111111"].trace_id == CALLER_B[0]
    assert by_parent["1111111111111111"].name == "ModelInfer"
    own = by_parent[""]
    assert own.trace_id not in (CALLER_A[0], CALLER_B[0])
    assert len({(s.trace_id, s.span_id) for s in requests}) == 4
    for request in requests:
        attributes = request.attributes
        assert attributes["rpc.grpc.status_code"] == "OK"
        assert attributes["textserve.model"] == MODEL
        assert attributes["textserve.model.version"] == 1
        assert attributes["textserve.texts"] == 1
        assert attributes["textserve.tokens"] >= 1
        # the stages as events at their starts, in order, each with its length
        events = sorted(request.events, key=lambda e: e[1])
        assert [e[0] for e in events] == ["queue", "tokenize", "inference"], request
        assert all(e[2]["textserve.seconds"] >= 0 for e in events)
        assert not [s for s in spans if s.parent_span_id == request.span_id]
    batches = [s for s in spans if s.name == "batch"]
    assert len(batches) == 1
    batch = batches[0]
    assert set(batch.links) == {(s.trace_id, s.span_id) for s in requests}
    assert batch.trace_id not in {s.trace_id for s in requests}  # its own trace, linked
    attributes = batch.attributes
    assert attributes["textserve.batch.size"] == 4
    assert attributes["textserve.batch.requests"] == 4
    assert attributes["textserve.batch.tokens"] >= attributes["textserve.batch.real_tokens"] >= 4
    assert 0.0 <= attributes["textserve.batch.padding_ratio"] < 1.0
    assert attributes["textserve.model"] == MODEL
    assert attributes["textserve.model.version"] == 1
    assert attributes["textserve.provider"] == "CPUExecutionProvider"


def test_our_client_sends_the_callers_trace_and_bad_traceparents_are_ignored(
    tmp_path: Path,
) -> None:
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
            client.classify(["a good film"])
            caller = span.get_span_context()
        channel = srv.channel()
        bad_values = (
            "00-zz-yy-01",
            "garbage",
            "00-" + "0" * 32 + "-" + "0" * 16 + "-01",  # all-zero ids are invalid
            f"ff-{CALLER_A[0]}-{CALLER_A[1]}-01",  # version ff is forbidden
        )
        for bad in bad_values:
            classify(channel, "a good film", (("traceparent", bad),)).result()  # no error
        # a caller that decided not to sample: no span at all
        classify(channel, "a good film", traceparent(*CALLER_A, flags="00")).result()
        flush(srv)
        # every span ended before its response was sent: the flush exported them all
        spans = receiver.wait_for(lambda s: len(requests_of(s)) >= 5)
    requests = requests_of(spans)
    assert len(requests) == 5
    from_client = [s for s in requests if s.trace_id == format(caller.trace_id, "032x")]
    assert len(from_client) == 1
    assert from_client[0].parent_span_id == format(caller.span_id, "016x")
    others = [s for s in requests if s is not from_client[0]]
    assert all(s.parent_span_id == "" for s in others)  # malformed: a trace of their own
    assert len({s.trace_id for s in others}) == 4
    assert CALLER_A[0] not in {s.trace_id for s in spans}


def test_nothing_is_exported_when_tracing_is_off(tmp_path: Path) -> None:
    make_version(tmp_path, MODEL, 1)
    with otlp_receiver() as receiver:
        with running_server(tmp_path) as srv:
            assert srv.server.ctx.telemetry.tracing is None
            classify(srv.channel(), "a good film", traceparent(*CALLER_A)).result()
        assert receiver.received() == [] and receiver.exports == 0


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once closed


def test_an_unreachable_endpoint_neither_fails_nor_slows_requests(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_version(tmp_path, MODEL, 1)
    caplog.set_level(logging.INFO, logger="textserve.service.tracing")
    with running_server(tmp_path) as srv:
        channel = srv.channel()

        def median_latency() -> float:
            times = []
            for _ in range(30):
                started = time.perf_counter()
                classify(channel, "a good film").result()
                times.append(time.perf_counter() - started)
            return statistics.median(times)

        median_latency()  # warm
        baseline = median_latency()
        tracing = Tracing(
            f"http://127.0.0.1:{closed_port()}", 1.0, metrics=srv.metrics, export_timeout=1.0
        )
        srv.server.ctx.telemetry.tracing = tracing  # as --otlp-endpoint would, export bounded
        traced = median_latency()
        tracing.flush()  # the exporter fails: spans dropped
        median_latency()
        tracing.flush()
        dropped = srv.metrics.registry.get_sample_value(
            "textserve_trace_spans_dropped_total", {"reason": "export_failed"}
        )
    assert dropped is not None and dropped >= 60  # each request's span and its stages
    warnings = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name == "textserve.service.tracing"
    ]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "dropping spans" in warnings[0].getMessage()
    # no export on the request path: the same order of latency as without tracing
    assert traced < 3 * baseline + 0.02, (traced, baseline)


def test_each_message_of_a_stream_is_a_traced_request_of_the_streams_trace(
    tmp_path: Path,
) -> None:
    """ClassifyStream (the bulk fast path: no task per message) traces every message as a
    request of the stream's caller, with its stages, and the batch links to them."""
    make_version(tmp_path, MODEL, 1)
    with (
        otlp_receiver() as receiver,
        running_server(tmp_path, otlp_endpoint=receiver.endpoint, trace_sample_ratio=1.0) as srv,
    ):
        stub = pb_grpc.ClassifierStub(srv.channel())
        requests = [pb.ClassifyRequest(id=f"m{i}", texts=["a good film"]) for i in range(3)]
        replies = list(
            stub.ClassifyStream(iter(requests), timeout=30, metadata=traceparent(*CALLER_A))
        )
        assert sorted(r.id for r in replies) == ["m0", "m1", "m2"]
        flush(srv)
        spans = receiver.wait_for(
            lambda s: len(requests_of(s)) == 3 and any(x.name == "batch" for x in s)
        )
    traced = requests_of(spans)
    assert {s.name for s in traced} == {"ClassifyStream"}
    assert {(s.trace_id, s.parent_span_id) for s in traced} == {CALLER_A}
    for span in traced:
        assert span.attributes["rpc.grpc.status_code"] == "OK"
        assert [e[0] for e in sorted(span.events, key=lambda e: e[1])] == [
            "queue",
            "tokenize",
            "inference",
        ]
    linked = {link for s in spans if s.name == "batch" for link in s.links}
    assert {(s.trace_id, s.span_id) for s in traced} <= linked
