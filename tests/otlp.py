"""An OTLP trace receiver for tests: the OTLP/gRPC TraceService of opentelemetry-proto on
127.0.0.1, keeping every span it is sent.

    with otlp_receiver() as receiver:
        ...  # a server with otlp_endpoint=receiver.endpoint
        spans = receiver.wait_for(lambda spans: len(spans) >= 3)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass
class Span:
    """One received span, ids as hex (as traceparent writes them)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace id, span id)
    service: str
    status_code: int
    events: list[tuple[str, int, dict[str, Any]]]  # (name, time in epoch ns, attributes)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        received = []
        for resource_spans in request.resource_spans:
            attrs = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for s in scope.spans:
                    received.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                            service=str(attrs.get("service.name", "")),
                            status_code=s.status.code,
                            events=[
                                (
                                    e.name,
                                    e.time_unix_nano,
                                    {a.key: _value(a.value) for a in e.attributes},
                                )
                                for e in s.events
                            ],
                        )
                    )
        with self._receiver.lock:
            self._receiver.spans.extend(received)
            self._receiver.exports += 1
        return trace_service_pb2.ExportTraceServiceResponse()


class Receiver:
    def __init__(self, port: int) -> None:
        self.endpoint = f"http://127.0.0.1:{port}"
        self.spans: list[Span] = []
        self.exports = 0
        self.lock = threading.Lock()

    def received(self) -> list[Span]:
        with self.lock:
            return list(self.spans)

    def wait_for(self, condition: Callable[[list[Span]], bool], timeout: float = 30) -> list[Span]:
        """The spans once `condition(spans)` holds; AssertionError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.received()
            if condition(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; received {len(spans)} spans: {spans}")
            time.sleep(0.05)  # polling, not a readiness guess


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    receiver = Receiver(port)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Service(receiver), server)
    server.start()
    try:
        yield receiver
    finally:
        server.stop(0)
