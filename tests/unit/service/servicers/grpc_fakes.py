"""gRPC fakes the servicers' interceptor tests share: a servicer context that records its
abort, the handler details an interceptor is given, and the four kinds of method handler."""

from __future__ import annotations

from typing import Any

import grpc


class FakeContext:
    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        self.aborted = (code, message)
        raise grpc.aio.AbortError()


class Details:
    def __init__(self, method: str, metadata: Any = ()) -> None:
        self.method = method
        self.invocation_metadata = metadata


# kind -> (the grpc handler factory, request streaming, response streaming)
KINDS = {
    "unary_unary": (grpc.unary_unary_rpc_method_handler, False, False),
    "unary_stream": (grpc.unary_stream_rpc_method_handler, False, True),
    "stream_unary": (grpc.stream_unary_rpc_method_handler, True, False),
    "stream_stream": (grpc.stream_stream_rpc_method_handler, True, True),
}


def serialize(response: Any) -> bytes:
    return b""
