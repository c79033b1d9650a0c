"""The textserve.v1.Classifier servicer: protobuf in, the core API (ModelHandle), protobuf out.

No tensors beyond reading the probabilities, no status codes built inline: errors are the
taxonomy of service/errors.py, mapped by its decorators (unary) or into a response's `error`
(ClassifyStream, where one bad request must not end the stream).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from textserve.service.repository.core import ModelRepository, State
from textserve.service.servicers.status import (
    deadline_of,
    grpc_code,
    grpc_errors,
    log_unexpected,
    model_name,
    observed,
    public_message,
)
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from textserve.service.engine.handle import ClassifyResult, ModelHandle
    from textserve.service.metrics import Metrics
    from textserve.service.servicers.context import ServingContext, Telemetry

logger = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Classifier"].full_name

_STATES = {
    State.AVAILABLE: pb.MODEL_STATE_AVAILABLE,
    State.LOADING: pb.MODEL_STATE_LOADING,
    State.READY: pb.MODEL_STATE_READY,
    State.UNLOADING: pb.MODEL_STATE_UNLOADING,
    State.FAILED: pb.MODEL_STATE_FAILED,
}


def build_response(
    request: pb.ClassifyRequest, handle: ModelHandle, result: ClassifyResult
) -> pb.ClassifyResponse:
    probs = result.probabilities
    labels = handle.labels
    # Python lists up front: indexing numpy arrays element by element costs more than the rest.
    best = probs.argmax(axis=1).tolist()
    best_scores = probs.max(axis=1).tolist()
    num_tokens = result.num_tokens.tolist()
    truncated = result.truncated.tolist()
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
            handle = self._repository.get(model_name(request.model), request.version or None)
            seen.reached(handle.name, handle.version, request.texts)
            truncate = request.truncate if request.HasField("truncate") else True
            seen.result = result = await handle.classify(
                request.texts, truncate=truncate, deadline=deadline, trace=seen.trace
            )
            return build_response(request, handle, result)

    @grpc_errors
    async def Classify(self, request: pb.ClassifyRequest, context: Any) -> pb.ClassifyResponse:
        return await self._classify(request, deadline_of(context), "Classify", context)

    @grpc_errors
    async def ClassifyStream(
        self, request_iterator: AsyncIterator[pb.ClassifyRequest], context: Any
    ) -> None:
        """Answer each request of the stream as it completes (each response carries its id).

        The fast path for bulk clients: a request goes from the reader straight into the
        batcher with a callback (ModelHandle.classify_nowait), no task per message; its answer
        is built in that callback, on the loop, as its batch finishes, and written in arrival
        order of the answers. Per message that is one read, one queue entry and one write.

        Backpressure: a request holds one of `stream_max_inflight` permits from the moment it
        is read until its response has been written to grpc. Without a permit the stream reads
        no more requests, so a client that stops reading its responses stops the server reading
        its requests, and HTTP/2 flow control slows the client; the server holds at most that
        many requests and responses per stream, whatever the client does."""
        deadline = deadline_of(context)
        limit = self._stream_max_inflight
        permits = asyncio.Semaphore(limit)
        # At most one response per permit, plus the end marker: put_nowait never finds it full.
        responses: asyncio.Queue[pb.ClassifyResponse | None] = asyncio.Queue(limit + 1)
        pending: set[asyncio.Future[None]] = set()  # requests in the batcher
        reading = True
        ended = False  # the handler returned: late answers (cancelled ones) go nowhere

        def answered(response: pb.ClassifyResponse) -> None:
            if ended:
                return
            responses.put_nowait(response)
            if not reading and not pending:
                responses.put_nowait(None)  # the last answer of a finished request stream

        def start(request: pb.ClassifyRequest) -> None:
            """Validate `request` and queue its texts; its answer (or error) comes through
            `answered`, counted in the metrics like a unary call's."""
            seen_cm = observed(
                self._metrics, "ClassifyStream", deadline, context=context,
                telemetry=self._telemetry,
            )  # fmt: skip
            seen = seen_cm.__enter__()
            future: asyncio.Future[None] | None = None

            def done(result: ClassifyResult | None, exc: BaseException | None) -> None:
                if future is not None:
                    pending.discard(future)
                if result is not None:
                    try:
                        response = build_response(request, handle, result)
                    except Exception as error:
                        exc = error
                    else:
                        seen.result = result
                        seen_cm.__exit__(None, None, None)
                        answered(response)
                        return
                assert exc is not None
                seen_cm.__exit__(type(exc), exc, exc.__traceback__)
                if not isinstance(exc, asyncio.CancelledError):  # the stream is ending
                    answered(_error_response(request, exc))

            try:
                handle = self._repository.get(model_name(request.model), request.version or None)
                seen.reached(handle.name, handle.version, request.texts)
                truncate = request.truncate if request.HasField("truncate") else True
                future = handle.classify_nowait(
                    request.texts, done, truncate=truncate, deadline=deadline, trace=seen.trace
                )
            except Exception as exc:
                done(None, exc)
                return
            pending.add(future)

        async def read() -> None:
            nonlocal reading
            requests = aiter(request_iterator)
            try:
                while True:
                    await permits.acquire()  # no permit, no read: the backpressure
                    request = await anext(requests, None)
                    if request is None:
                        break
                    start(request)
            finally:
                # A request stream that breaks (an undecodable message) ends the response
                # stream too, instead of leaving it waiting; `await reader` re-raises.
                reading = False
                if not pending:
                    responses.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (response := await responses.get()) is not None:
                await _write(context, response)  # returns once grpc took it (flow control)
                permits.release()
            await reader  # surfaces a failure of the request stream itself
        except asyncio.CancelledError:
            # The client cancelled, its deadline passed or its connection went: not an error.
            logger.debug(
                "ClassifyStream cancelled by the client or its deadline (%d requests in flight)",
                len(pending),
            )
            raise
        finally:
            ended = True
            reader.cancel()
            for future in list(pending):
                future.cancel()  # dropped by the batcher; counted as cancelled (or expired)

    @grpc_errors
    async def ListModels(
        self, request: pb.ListModelsRequest, context: Any
    ) -> pb.ListModelsResponse:
        repository = self._repository
        models = []
        for record in repository.models.values():
            ready = record.ready()
            models.append(
                pb.ModelSummary(
                    name=record.name,
                    versions=self._versions(record.versions.values()),
                    ready_version=ready[0].version if ready else 0,
                    is_default=record.name == repository.default_model,
                )
            )
        return pb.ListModelsResponse(models=models, default_model=repository.default_model or "")

    @grpc_errors
    async def GetModel(self, request: pb.GetModelRequest, context: Any) -> pb.ModelInfo:
        handle = self._repository.get(model_name(request.name), request.version or None)
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
            versions=self._versions(record.versions.values()),
            is_default=handle.name == self._repository.default_model,
            test_accuracy=handle.manifest.test_accuracy,
            created_at=handle.manifest.created_at,
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

    @staticmethod
    def _versions(records: Any) -> list[pb.VersionStatus]:
        return [
            pb.VersionStatus(version=v.version, state=_STATES[v.state], reason=v.reason)
            for v in sorted(records, key=lambda v: v.version)
        ]


def _error_response(request: pb.ClassifyRequest, exc: BaseException) -> pb.ClassifyResponse:
    """A stream's answer to a request that failed: its id and the status it would have had."""
    log_unexpected(exc, "ClassifyStream")
    return pb.ClassifyResponse(
        id=request.id, error=pb.Status(code=grpc_code(exc).value[0], message=public_message(exc))
    )


async def _write(context: Any, response: pb.ClassifyResponse) -> None:
    """context.write, where a failure means the call has ended under us (the client cancelled,
    its deadline passed, its connection went) and ends the handler as cancelled: grpc logs a
    failed write of a handler (e.g. a response generator's) as an ERROR with a traceback, and a
    cancelled handler at DEBUG, which is what a client going away is."""
    try:
        await context.write(response)
    except Exception as exc:
        raise asyncio.CancelledError(f"writing a response failed: {exc!r}") from exc


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
