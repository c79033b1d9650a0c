"""An OTLP/gRPC trace sink for `textserve bench`: accepts the server's spans and counts them,
so that the tracing-on step measures real export (serialisation, gRPC), not a dead endpoint.

    with otlp_sink() as sink:      # sink.endpoint: http://127.0.0.1:PORT
        ...                        # a server with --otlp-endpoint sink.endpoint
        sink.spans                 # spans received
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc


class Sink:
    def __init__(self, port: int) -> None:
        self.endpoint = f"http://127.0.0.1:{port}"
        self.spans = 0
        self._lock = threading.Lock()

    def add(self, spans: int) -> None:
        with self._lock:
            self.spans += spans


@contextmanager
def otlp_sink() -> Iterator[Sink]:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            sink.add(sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans))
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    sink = Sink(port)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    server.start()
    try:
        yield sink
    finally:
        server.stop(0)
