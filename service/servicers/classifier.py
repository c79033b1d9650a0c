"""The textserve.v1.Classifier servicer: protobuf in, the core API (ModelHandle), protobuf out.

No tensors beyond reading the probabilities, no status codes built inline: errors are the
taxonomy of service/errors.py, mapped by its decorators (unary) or into a response's `error`
(ClassifyStream, servicers/stream.py, where one bad request must not end the stream).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from textserve.service.servicers.convert import model_summary, version_statuses
from textserve.service.servicers.resolve import pairs_of, resolve, threshold_of, truncation
from textserve.service.servicers.status import deadline_of, grpc_errors, observed
from textserve.service.servicers.stream import ClassifyStreamCall
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from textserve.service.engine.handle import ClassifyResult, ModelHandle
    from textserve.service.metrics import Metrics
    from textserve.service.repository.core import ModelRepository
    from textserve.service.servicers.context import ServingContext, Telemetry

logger = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Classifier"].full_name


def build_response(
    request: pb.ClassifyRequest, handle: ModelHandle, result: ClassifyResult
) -> pb.ClassifyResponse:
    probs = result.probabilities
    labels = handle.labels
    threshold = threshold_of(request, handle)
    # multi-label: per text, the labels whose own score reaches the threshold (label order)
    passing = None if threshold is None else (probs >= threshold).tolist()
    # Python lists up front: indexing numpy arrays element by element costs more than the rest.
    best = probs.argmax(axis=1).tolist()
    best_scores = probs.max(axis=1).tolist()
    num_tokens = result.num_tokens.tolist()
    truncated = result.truncated.tolist()
    cached = None if result.cached is None else result.cached.tolist()
    top_k = min(int(request.top_k), len(labels))
    order = np.argsort(-probs, axis=1, kind="stable")[:, :top_k].tolist() if top_k else None
    rows = probs.tolist() if order is not None or request.all_scores else None
    # Built in place (results.add, timing fields): constructor arguments would be copied.
    response = pb.ClassifyResponse(id=request.id, model=handle.name, model_version=handle.version)
    add = response.results.add
    for i in range(len(best)):
        text = add(
            label=labels[best[i]],
            score=best_scores[i],
            num_tokens=num_tokens[i],
            truncated=truncated[i],
        )
        if cached is not None and cached[i]:
            text.cached = True
        if passing is not None:
            text.labels_over_threshold.extend(
                label for label, on in zip(labels, passing[i], strict=True) if on
            )
        if rows is not None:
            if order is not None:
                text.top.extend(pb.LabelScore(label=labels[j], score=rows[i][j]) for j in order[i])
            if request.all_scores:
                text.scores.extend(rows[i])
    if request.all_scores:
        response.labels.extend(labels)
    timings, timing = result.timings, response.timing
    timing.queue_seconds = timings.queue_seconds
    timing.tokenize_seconds = timings.tokenize_seconds
    timing.inference_seconds = timings.inference_seconds
    timing.total_seconds = timings.total_seconds
    return response


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
    }


class ClassifierServicer(pb_grpc.ClassifierServicer):
    def __init__(
        self,
        repository: ModelRepository,
        metrics: Metrics | None,
        *,
        stream_max_inflight: int = 32,  # ServerConfig.stream_max_inflight
        telemetry: Telemetry | None = None,  # tracing and the access log, when on
    ) -> None:
        self._repository = repository
        self._telemetry = telemetry
        self._metrics = metrics
        self._stream_max_inflight = stream_max_inflight

    async def _classify(
        self, request: pb.ClassifyRequest, deadline: float | None, method: str, context: Any
    ) -> pb.ClassifyResponse:
        with observed(
            self._metrics, method, deadline, context=context, telemetry=self._telemetry
        ) as seen:
            handle = resolve(self._repository, request.model, request.version)
            seen.reached(handle.name, handle.version, request.texts)
            truncate = truncation(request.truncate if request.HasField("truncate") else None)
            threshold_of(request, handle)  # a bad threshold costs no inference
            seen.result = result = await handle.classify(
                request.texts,
                pairs=pairs_of(request),
                truncate=truncate,
                deadline=deadline,
                trace=seen.trace,
            )
            return build_response(request, handle, result)

    @grpc_errors
    async def Classify(self, request: pb.ClassifyRequest, context: Any) -> pb.ClassifyResponse:
        return await self._classify(request, deadline_of(context), "Classify", context)

    @grpc_errors
    async def ClassifyStream(
        self, request_iterator: AsyncIterator[pb.ClassifyRequest], context: Any
    ) -> None:
        """Answer each request of the stream as it completes (servicers/stream.py)."""
        await ClassifyStreamCall(
            self._repository,
            self._metrics,
            self._telemetry,
            build_response,
            self._stream_max_inflight,
            request_iterator,
            context,
        ).run()

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
    pb_grpc.add_ClassifierServicer_to_server(
        ClassifierServicer(
            ctx.repository,
            ctx.metrics,
            stream_max_inflight=ctx.config.stream_max_inflight,
            telemetry=ctx.telemetry,
        ),
        server,
    )
    return [SERVICE_NAME]
