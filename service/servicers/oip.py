"""The KServe v2 Open Inference Protocol servicer (inference.GRPCInferenceService), a gRPC codec
over the data plane's OIP operations (dataplane/oip.py), which HTTP's KServe v2 routes share.

Serves the six OIP RPCs and Triton's ModelConfig and ModelStatistics on the same port as
textserve.v1, over the same repository, batchers and metrics: a ModelInfer's texts join the
same batches as Classify's. Errors map through servicers/status.py only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from textserve.oip import grpc_service_pb2 as pb
from textserve.oip import grpc_service_pb2_grpc as pb_grpc
from textserve.service.dataplane import oip
from textserve.service.servicers.status import deadline_of, grpc_errors

if TYPE_CHECKING:
    from textserve.service.dataplane.context import ServingContext

SERVICE_NAME = "inference.GRPCInferenceService"
METHOD = "ModelInfer"  # the `method` label of the metrics


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """inference.GRPCInferenceService over the shared serving context."""

    def __init__(self, ctx: ServingContext) -> None:
        self._ctx = ctx

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=oip.server_ready(self._ctx))

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(
            ready=oip.model_ready(self._ctx, request.name, request.version)
        )

    @grpc_errors
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return oip.server_metadata()

    @grpc_errors
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        return oip.metadata_of(self._ctx, request.name, request.version)

    @grpc_errors
    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelConfigResponse:
        return oip.model_config_of(self._ctx, request.name, request.version)

    @grpc_errors
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatisticsResponse:
        return oip.statistics_of(self._ctx, request.name, request.version)

    @grpc_errors
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        return await oip.infer(
            self._ctx,
            request.model_name,
            request.model_version,
            lambda handle: request,
            method=METHOD,
            deadline=deadline_of(context),
            context=context,
        )


def register(server: grpc.aio.Server, ctx: ServingContext) -> list[str]:
    """Add the OIP servicer to ``server``; returns the service names it added."""
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(ctx), server)
    return [SERVICE_NAME]
