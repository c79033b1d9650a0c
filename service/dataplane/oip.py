"""The KServe v2 Open Inference Protocol, transport-neutral: infer, readiness, the model's metadata,
Triton's model config and statistics, each written once for gRPC and HTTP.

    response = await infer(ctx, "default", "", lambda handle: message, method="ModelInfer", ...)
    config = model_config_of(ctx, "default", "2")        # -> ModelConfigResponse
    stats = statistics_of(ctx, "", "")                    # every ready model's

The OIP messages (textserve/oip's protobuf classes) are the protocol's data model here, as
MLServer's data plane works on its V2 types: gRPC sends them as they are, HTTP as KServe's JSON
(or Triton's binary extension). Tensors are decoded and encoded by oip_codec, the model's
self-description built by oip_describe.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from importlib import metadata
from typing import TYPE_CHECKING, Any

from textserve.oip import grpc_service_pb2 as pb
from textserve.service.dataplane.observe import Seen, observed
from textserve.service.dataplane.oip_codec import (
    INPUT_NAME,
    TOKEN_OUTPUT_NAMES,
    decode_request,
    encode_entities,
    encode_response,
)
from textserve.service.dataplane.oip_describe import model_config, model_metadata, model_statistics
from textserve.service.dataplane.prologue import resolve, truncation
from textserve.service.dataplane.tag import TagCall, request_of
from textserve.service.errors import ModelNotFoundError, NotReadyError, ValidationError

if TYPE_CHECKING:
    from textserve.service.dataplane.context import ServingContext
    from textserve.service.engine.handle import ModelHandle

# Triton extensions this server implements, as ServerMetadata lists them.
EXTENSIONS = ("model_configuration", "statistics", "parameters")


@functools.cache
def server_version() -> str:
    """This package's version (read once: importlib.metadata scans the installed
    distributions)."""
    try:
        return metadata.version("textserve")
    except metadata.PackageNotFoundError:  # running from a checkout that was never installed
        return "0+unknown"


async def infer(
    ctx: ServingContext,
    model: str,
    version: str,
    parse: Callable[[ModelHandle], pb.ModelInferRequest],
    *,
    method: str,
    deadline: float | None,
    context: Any = None,
) -> pb.ModelInferResponse:
    """ModelInfer: the version first (NOT_FOUND wins over a bad tensor, as in Triton), then
    `parse(handle)` (a codec's message: gRPC's as it came, HTTP's from JSON or binary), its
    texts classified in the shared batches and answered as OIP tensors; observed as `method`."""
    with observed(
        ctx.metrics, method, deadline, model, context=context, telemetry=ctx.telemetry
    ) as seen:
        handle = resolve(ctx.repository, model, version)
        seen.model = handle.name
        if handle.tags_tokens:
            return await _infer_entities(ctx, handle, parse(handle), seen, deadline)
        decoded = decode_request(parse(handle))
        seen.reached(handle.name, handle.version, decoded.texts)
        try:
            seen.result = result = await handle.classify(
                decoded.texts,
                pairs=decoded.pairs,
                truncate=truncation(decoded.truncate),
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


async def _infer_entities(
    ctx: ServingContext,
    handle: ModelHandle,
    request: pb.ModelInferRequest,
    seen: Seen,
    deadline: float | None,
) -> pb.ModelInferResponse:
    """ModelInfer on a token classifier: TEXT in, ENTITIES out (the model's tagging defaults;
    the string parameter `aggregation` chooses another strategy)."""
    decoded = decode_request(request, TOKEN_OUTPUT_NAMES)
    seen.reached(handle.name, handle.version, decoded.texts)
    parameter = request.parameters.get("aggregation")
    aggregation = "" if parameter is None else parameter.string_param
    call = TagCall(decoded.texts, aggregation=aggregation, truncate=decoded.truncate)
    try:
        result = await handle.tag(
            decoded.texts,
            request_of(handle, call),
            truncate=truncation(decoded.truncate),
            deadline=deadline,
            trace=seen.trace,
        )
    except ValidationError as exc:
        raise ValidationError(f"input tensor {INPUT_NAME!r}: {exc}") from None
    seen.result = result  # type: ignore[assignment]
    answers = [
        json.dumps([entity.as_dict() for entity in entities], ensure_ascii=False)
        for entities in result.entities
    ]
    return encode_entities(
        decoded, answers, model_name=handle.name, model_version=str(handle.version)
    )


def ready_versions(ctx: ServingContext, name: str) -> list[int]:
    record = ctx.repository.models.get(name)
    return [] if record is None else [v.version for v in record.ready()]


def model_ready(ctx: ServingContext, name: str, version: str) -> bool:
    """Whether `name` (at `version`, "" the newest) can take requests; an unknown model is
    "not ready" rather than an error, as Triton answers, so probes need no error handling."""
    try:
        resolve(ctx.repository, name, version)
    except (ModelNotFoundError, NotReadyError):
        return False
    return True


def server_ready(ctx: ServingContext) -> bool:
    """Ready when every model has a version that can take requests, as Triton answers."""
    names = list(ctx.repository.models)
    return bool(names) and all(model_ready(ctx, name, "") for name in names)


def server_metadata() -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(
        name="textserve", version=server_version(), extensions=list(EXTENSIONS)
    )


def metadata_of(ctx: ServingContext, name: str, version: str) -> pb.ModelMetadataResponse:
    handle = resolve(ctx.repository, name, version)
    return model_metadata(handle, ready_versions(ctx, handle.name))


def model_config_of(ctx: ServingContext, name: str, version: str) -> pb.ModelConfigResponse:
    handle = resolve(ctx.repository, name, version)
    config = ctx.config
    return model_config(
        handle,
        max_batch_size=config.max_texts_per_request,
        batcher_max_batch_size=config.batcher.max_batch_size,
        max_queue_delay=config.batcher.max_queue_delay,
    )


def statistics_of(ctx: ServingContext, name: str, version: str) -> pb.ModelStatisticsResponse:
    """Triton's statistics of `name` at `version`, or of every ready model when `name` is ""."""
    if name:
        handles = [resolve(ctx.repository, name, version)]
    else:
        names = [n for n in ctx.repository.models if ready_versions(ctx, n)]
        handles = [resolve(ctx.repository, n, "") for n in names]
    return pb.ModelStatisticsResponse(
        model_stats=[model_statistics(ctx.metrics, h.name, str(h.version)) for h in handles]
    )
