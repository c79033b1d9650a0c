"""A gRPC server with no model at all, for measuring the load generator's own ceiling.

    python -m textserve.bench.echo [HOST:PORT] [--ready-file PATH]
    # prints "listening on 127.0.0.1:PORT" (and writes PATH as `textserve serve` does); runs
    # until killed

It answers textserve.v1 Classify and ClassifyStream (one answer per message, written with
context.write as textserve does) and inference ModelInfer with a canned result per text (the
request is parsed, the answer built and serialized, like a real server's transport work), plus
ModelMetadata, ModelConfig and ModelStatistics as textserve describes a model (so perf_analyzer
drives it like textserve: `python -m textserve.bench.perf_analyzer --floor`), and
grpc.health.v1 SERVING. The stream's figure is the transport's per-message floor. What the
load generator drives against it bounds what it can drive against textserve on the same
machine: when that is well above textserve's peak, the load generator is not what limits the
figures.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from textserve.service.cli import write_ready_file
from textserve.service.dataplane import oip_describe


class _EchoModel:
    """What oip_describe reads of a model handle: any model name, one label."""

    def __init__(self, name: str) -> None:
        self.name, self.version, self.labels = name, 1, ("echo",)


def _handlers() -> list[grpc.GenericRpcHandler]:
    """The echo server's services: textserve.v1.Classifier and the KServe v2 (OIP) one."""
    return [_classifier_handler(), _oip_handler()]


def _unary(handler: Any, request_type: Any, response_type: Any) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        handler,
        request_deserializer=request_type.FromString,
        response_serializer=response_type.SerializeToString,
    )


def _classifier_handler() -> grpc.GenericRpcHandler:
    """textserve.v1.Classifier: one "echo" label per text, unary and streamed."""
    from textserve.v1 import classifier_pb2 as pb

    async def classify(request: pb.ClassifyRequest, context: object) -> pb.ClassifyResponse:
        return pb.ClassifyResponse(
            id=request.id,
            model="echo",
            model_version=1,
            results=[pb.TextResult(label="echo", score=1.0) for _ in request.texts],
        )

    def answer(request: pb.ClassifyRequest) -> pb.ClassifyResponse:
        return pb.ClassifyResponse(
            id=request.id,
            model="echo",
            model_version=1,
            results=[pb.TextResult(label="echo", score=1.0) for _ in request.texts],
        )

    async def classify_stream(requests: AsyncIterator[pb.ClassifyRequest], context: Any) -> None:
        async for request in requests:
            await context.write(answer(request))

    return grpc.method_handlers_generic_handler(
        "textserve.v1.Classifier",
        {
            "Classify": _unary(classify, pb.ClassifyRequest, pb.ClassifyResponse),
            "ClassifyStream": grpc.stream_stream_rpc_method_handler(
                classify_stream,
                request_deserializer=pb.ClassifyRequest.FromString,
                response_serializer=pb.ClassifyResponse.SerializeToString,
            ),
        },
    )


def _oip_handler() -> grpc.GenericRpcHandler:
    """KServe v2 (OIP): ModelInfer answers "echo" per text; metadata, config, statistics."""
    from textserve.oip import grpc_service_pb2 as oip

    async def model_infer(
        request: oip.ModelInferRequest, context: object
    ) -> oip.ModelInferResponse:
        n = int(request.inputs[0].shape[0]) if request.inputs and request.inputs[0].shape else 0
        tensor = oip.ModelInferResponse.InferOutputTensor
        return oip.ModelInferResponse(
            model_name=request.model_name,
            model_version="1",
            id=request.id,
            outputs=[tensor(name="LABEL", datatype="BYTES", shape=[n])],
            raw_output_contents=[b"\x04\x00\x00\x00echo" * n],
        )

    async def server_metadata(
        request: oip.ServerMetadataRequest, context: object
    ) -> oip.ServerMetadataResponse:
        return oip.ServerMetadataResponse(name="echo", version="0", extensions=[])

    async def model_metadata(
        request: oip.ModelMetadataRequest, context: object
    ) -> oip.ModelMetadataResponse:
        return oip_describe.model_metadata(_EchoModel(request.name), versions=[1])

    async def model_config(
        request: oip.ModelConfigRequest, context: object
    ) -> oip.ModelConfigResponse:
        return oip_describe.model_config(
            _EchoModel(request.name),
            max_batch_size=1024,
            batcher_max_batch_size=64,
            max_queue_delay=0.0,
        )

    async def model_statistics(
        request: oip.ModelStatisticsRequest, context: object
    ) -> oip.ModelStatisticsResponse:
        # no counts kept: perf_analyzer's server-side columns read 0 for the echo server
        stats = oip.ModelStatistics(name=request.name, version=request.version or "1")
        return oip.ModelStatisticsResponse(model_stats=[stats])

    return grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {
            "ServerMetadata": _unary(
                server_metadata, oip.ServerMetadataRequest, oip.ServerMetadataResponse
            ),
            "ModelInfer": _unary(model_infer, oip.ModelInferRequest, oip.ModelInferResponse),
            "ModelMetadata": _unary(
                model_metadata, oip.ModelMetadataRequest, oip.ModelMetadataResponse
            ),
            "ModelConfig": _unary(model_config, oip.ModelConfigRequest, oip.ModelConfigResponse),
            "ModelStatistics": _unary(
                model_statistics, oip.ModelStatisticsRequest, oip.ModelStatisticsResponse
            ),
        },
    )


async def main(listen: str = "127.0.0.1:0", ready_file: Path | None = None) -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(_handlers())
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port(listen)
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    address = f"{listen.rpartition(':')[0]}:{port}"
    print(f"listening on {address}", flush=True)
    if ready_file is not None:
        write_ready_file(ready_file, address, None, 1)
    await server.wait_for_termination()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m textserve.bench.echo")
    parser.add_argument("listen", nargs="?", default="127.0.0.1:0")
    parser.add_argument("--ready-file", type=Path, default=None)
    args = parser.parse_args()
    asyncio.run(main(args.listen, args.ready_file))
