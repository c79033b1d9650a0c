"""The textserve.v1.Classifier servicer, a gRPC codec over the data plane: decode the request
into a ClassifyCall, call dataplane.classify, send its v1_response.

No tensors, no status codes built inline: errors are the taxonomy of service/errors.py, mapped
by its decorators (unary) or into a response's `error` (ClassifyStream, servicers/stream.py,
where one bad request must not end the stream).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from textserve.service.dataplane.classify import ClassifyCall, classify, v1_response
from textserve.service.dataplane.prologue import resolve
from textserve.service.dataplane.rerank import RerankCall, rerank, v1_rerank_response
from textserve.service.dataplane.tag import TagCall, tag, v1_tag_response
from textserve.service.dataplane.zeroshot import ZeroShotCall, v1_zero_shot_response, zero_shot
from textserve.service.engine.window_options import Windows, checked
from textserve.service.servicers.convert import model_summary, version_statuses
from textserve.service.servicers.status import deadline_of, grpc_errors
from textserve.service.servicers.stream import ClassifyStreamCall, TagStreamCall
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from textserve.service.dataplane.context import ServingContext
    from textserve.service.engine.handle import ModelHandle

logger = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Classifier"].full_name


def call_of(request: pb.ClassifyRequest) -> ClassifyCall:
    """The data plane's call of a textserve.v1 request (unary, or one of a stream's)."""
    return ClassifyCall(
        request.texts,
        list(request.text_pairs) if request.text_pairs else None,
        request.model,
        request.version,
        request.truncate if request.HasField("truncate") else None,
        request.threshold if request.HasField("threshold") else None,
        request.top_k,
        request.all_scores,
        request.id,
        _windows(request, "mean"),
    )


def _windows(request: pb.ClassifyRequest | pb.RerankRequest, default: str) -> Windows | None:
    if not request.HasField("windows"):
        return None
    return checked(request.windows.aggregate or default, request.windows.stride)


def rerank_call_of(request: pb.RerankRequest) -> RerankCall:
    """The data plane's call of a textserve.v1 RerankRequest."""
    return RerankCall(
        request.query,
        request.documents,
        request.model,
        request.version,
        request.truncate if request.HasField("truncate") else None,
        request.top_n,
        request.raw_scores,
        request.return_documents,
        request.id,
        _windows(request, "max"),
    )


def zero_shot_call_of(request: pb.ZeroShotRequest) -> ZeroShotCall:
    """The data plane's call of a textserve.v1 ZeroShotRequest."""
    return ZeroShotCall(
        request.texts,
        request.candidate_labels,
        request.hypothesis_template,
        request.multi_label,
        request.model,
        request.version,
        request.truncate if request.HasField("truncate") else None,
        request.id,
    )


def tag_call_of(request: pb.TagRequest) -> TagCall:
    """The data plane's call of a textserve.v1 TagRequest (unary, or one of a stream's)."""
    return TagCall(
        request.texts,
        request.model,
        request.version,
        request.aggregation,
        list(request.ignore_labels.labels) if request.HasField("ignore_labels") else None,
        request.threshold,
        request.windows if request.HasField("windows") else None,
        request.stride if request.HasField("stride") else None,
        request.truncate if request.HasField("truncate") else None,
        request.id,
    )


def model_contract(handle: ModelHandle) -> dict[str, Any]:
    """ModelInfo's fields from the manifest's contract: source, activation, inputs, threshold."""
    manifest = handle.manifest
    return {
        "source_kind": manifest.source.kind,
        "architecture": manifest.source.architecture,
        "model_type": manifest.source.model_type or "",
        "activation": manifest.activation,
        "inputs": manifest.inputs,
        "threshold": manifest.decision_threshold if manifest.activation == "sigmoid" else 0.0,
        "truncation_side": manifest.truncation_side,
        "task": manifest.task,
        **_tagging(manifest.tagging),
        **_zero_shot(manifest.zero_shot),
    }


def _tagging(tagging: dict[str, Any] | None) -> dict[str, Any]:
    if tagging is None:
        return {}
    fields = {
        "label_scheme": tagging["scheme"],
        "aggregation": tagging["aggregation"],
        "ignore_labels": tagging["ignore_labels"],
    }
    return fields if tagging["stride"] is None else {**fields, "stride": tagging["stride"]}


def _zero_shot(zero_shot: dict[str, int | None] | None) -> dict[str, int]:
    """An NLI model's recorded label indexes as ModelInfo's entailment_label and
    contradiction_label (each unset when not recorded)."""
    names = {"entailment": "entailment_label", "contradiction": "contradiction_label"}
    return {names[k]: i for k, i in (zero_shot or {}).items() if i is not None}


class ClassifierServicer(pb_grpc.ClassifierServicer):
    """textserve.v1 over the data plane: decode (call_of), call, encode (v1_response)."""

    def __init__(self, ctx: ServingContext) -> None:
        self._ctx = ctx
        self._repository = ctx.repository

    @grpc_errors
    async def Classify(self, request: pb.ClassifyRequest, context: Any) -> pb.ClassifyResponse:
        return await classify(
            self._ctx,
            call_of(request),
            v1_response,
            method="Classify",
            deadline=deadline_of(context),
            context=context,
        )

    @grpc_errors
    async def Rerank(self, request: pb.RerankRequest, context: Any) -> pb.RerankResponse:
        return await rerank(
            self._ctx,
            rerank_call_of(request),
            v1_rerank_response,
            method="Rerank",
            deadline=deadline_of(context),
            context=context,
        )

    @grpc_errors
    async def ZeroShot(self, request: pb.ZeroShotRequest, context: Any) -> pb.ZeroShotResponse:
        return await zero_shot(
            self._ctx,
            zero_shot_call_of(request),
            v1_zero_shot_response,
            method="ZeroShot",
            deadline=deadline_of(context),
            context=context,
        )

    @grpc_errors
    async def Tag(self, request: pb.TagRequest, context: Any) -> pb.TagResponse:
        return await tag(
            self._ctx,
            tag_call_of(request),
            v1_tag_response,
            method="Tag",
            deadline=deadline_of(context),
            context=context,
        )

    @grpc_errors
    async def TagStream(self, request_iterator: AsyncIterator[pb.TagRequest], context: Any) -> None:
        """Answer each request of the stream as it completes (servicers/stream.py)."""
        await TagStreamCall(self._ctx, tag_call_of, request_iterator, context).run()

    @grpc_errors
    async def ClassifyStream(
        self, request_iterator: AsyncIterator[pb.ClassifyRequest], context: Any
    ) -> None:
        """Answer each request of the stream as it completes (servicers/stream.py)."""
        await ClassifyStreamCall(self._ctx, call_of, request_iterator, context).run()

    @grpc_errors
    async def ListModels(
        self, request: pb.ListModelsRequest, context: Any
    ) -> pb.ListModelsResponse:
        repository = self._repository
        default = repository.default_model
        return pb.ListModelsResponse(
            models=[model_summary(record, default) for record in repository.models.values()],
            default_model=default or "",
        )

    @grpc_errors
    async def GetModel(self, request: pb.GetModelRequest, context: Any) -> pb.ModelInfo:
        handle = resolve(self._repository, request.name, request.version)
        record = self._repository.models[handle.name]
        stats = handle.stats()
        config = handle.batcher.config
        return pb.ModelInfo(
            name=handle.name,
            version=handle.version,
            state=pb.MODEL_STATE_READY,
            labels=handle.labels,
            max_length=handle.max_length,
            execution_provider=handle.provider,
            precision=handle.manifest.precision,
            versions=version_statuses(record.versions.values()),
            is_default=handle.name == self._repository.default_model,
            test_accuracy=handle.manifest.test_accuracy,
            created_at=handle.manifest.created_at,
            **model_contract(handle),
            batching=pb.BatchingStats(
                batches=stats.batches,
                items=stats.items,
                mean_batch_size=stats.mean_batch_size,
                max_batch_size_seen=stats.max_batch_size_seen,
                dropped_deadline=stats.dropped_deadline,
                dropped_cancelled=stats.dropped_cancelled,
                rejected_overloaded=stats.rejected_overloaded,
                queue_depth=stats.queue_depth,
                max_batch_size=config.max_batch_size,
                max_batch_tokens=config.max_batch_tokens,
                max_queue_delay_seconds=config.max_queue_delay,
                max_queue_size=config.max_queue_size,
                padded_tokens=stats.padded_tokens,
                padding_tokens=stats.padding_tokens,
            ),
        )


def register(server: grpc.aio.Server, ctx: ServingContext) -> list[str]:
    """Add the Classifier service to `server`; returns its full name for health and reflection."""
    pb_grpc.add_ClassifierServicer_to_server(ClassifierServicer(ctx), server)
    return [SERVICE_NAME]
