"""The KServe v2 Open Inference Protocol servicer: inference.GRPCInferenceService.

Serves the six OIP RPCs and Triton's ModelConfig and ModelStatistics on the same port as
textserve.v1, over the same repository, batchers and metrics: a ModelInfer's texts join the
same batches as Classify's. Decoding and encoding of tensors live in oip_codec, the model's
self-description in oip_describe; errors map through servicers/status.py only.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING

import grpc

from textserve.oip import grpc_service_pb2 as pb
from textserve.oip import grpc_service_pb2_grpc as pb_grpc
from textserve.service.errors import ModelNotFoundError, NotReadyError, ValidationError
from textserve.service.servicers.oip_codec import INPUT_NAME, decode_request, encode_response
from textserve.service.servicers.oip_describe import model_config, model_metadata, model_statistics
from textserve.service.servicers.resolve import resolve, truncation
from textserve.service.servicers.status import deadline_of, grpc_errors, observed

if TYPE_CHECKING:
    from textserve.service.engine.handle import ModelHandle
    from textserve.service.servicers.context import ServingContext

SERVICE_NAME = "inference.GRPCInferenceService"
METHOD = "ModelInfer"  # the `method` label of the metrics
# Triton extensions this server implements, as ServerMetadata lists them.
EXTENSIONS = ("model_configuration", "statistics", "parameters")


def server_version() -> str:
    try:
        return metadata.version("textserve")
    except metadata.PackageNotFoundError:  # running from a checkout that was never installed
        return "0+unknown"


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """inference.GRPCInferenceService over the shared serving context."""

    def __init__(self, ctx: ServingContext) -> None:
        self._ctx = ctx
        self._version = server_version()

    def _handle(self, name: str, version: str) -> ModelHandle:
        return resolve(self._ctx.repository, name, version)

    def _ready_versions(self, name: str) -> list[int]:
        record = self._ctx.repository.models.get(name)
        return [] if record is None else [v.version for v in record.ready()]

    def _is_ready(self, name: str, version: str) -> bool:
        try:
            self._handle(name, version)
        except (ModelNotFoundError, NotReadyError):
            return False
        return True

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        # Ready when every model has a version that can take requests, as Triton answers.
        names = list(self._ctx.repository.models)
        return pb.ServerReadyResponse(
            ready=bool(names) and all(self._is_ready(n, "") for n in names)
        )

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        # An unknown model is "not ready" rather than an error, as Triton answers, so that
        # readiness probes need no error handling.
        return pb.ModelReadyResponse(ready=self._is_ready(request.name, request.version))

    @grpc_errors
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name="textserve", version=self._version, extensions=list(EXTENSIONS)
        )

    @grpc_errors
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        handle = self._handle(request.name, request.version)
        return model_metadata(handle, self._ready_versions(handle.name))

    @grpc_errors
    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelConfigResponse:
        handle = self._handle(request.name, request.version)
        config = self._ctx.config
        return model_config(
            handle,
            max_batch_size=config.max_texts_per_request,
            batcher_max_batch_size=config.batcher.max_batch_size,
            max_queue_delay=config.batcher.max_queue_delay,
        )

    @grpc_errors
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatisticsResponse:
        if request.name:
            handles = [self._handle(request.name, request.version)]
        else:
            names = [n for n in self._ctx.repository.models if self._ready_versions(n)]
            handles = [self._handle(name, "") for name in names]
        return pb.ModelStatisticsResponse(
            model_stats=[
                model_statistics(self._ctx.metrics, h.name, str(h.version)) for h in handles
            ]
        )

    @grpc_errors
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        deadline = deadline_of(context)
        # The name asked for: the metrics count unknown names as one label value.
        ctx = self._ctx
        with observed(
            ctx.metrics,
            METHOD,
            deadline,
            request.model_name,
            context=context,
            telemetry=ctx.telemetry,
        ) as seen:
            # The model first, as Triton does: NOT_FOUND wins over a bad tensor.
            handle = self._handle(request.model_name, request.model_version)
            seen.model = handle.name
            decoded = decode_request(request)
            seen.reached(handle.name, handle.version, decoded.texts)
            truncate = truncation(decoded.truncate)
            try:
                seen.result = result = await handle.classify(
                    decoded.texts,
                    pairs=decoded.pairs,
                    truncate=truncate,
                    deadline=deadline,
                    trace=seen.trace,
                )
            except ValidationError as exc:
                # The core speaks of texts[i]; OIP clients sent a tensor.
                raise ValidationError(f"input tensor {INPUT_NAME!r}: {exc}") from None
            return encode_response(
                decoded,
                result.probabilities,
                handle.labels,
                model_name=handle.name,
                model_version=str(handle.version),
            )


def register(server: grpc.aio.Server, ctx: ServingContext) -> list[str]:
    """Add the OIP servicer to ``server``; returns the service names it added."""
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(ctx), server)
    return [SERVICE_NAME]
