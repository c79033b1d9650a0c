"""The HTTP routes: the probes, /metrics, KServe v2 REST and POST /v1/classify.

Each handler takes (app, request) and returns a Response; errors are the taxonomy's exceptions,
answered by app.py with their status. Inference goes through the same prologue (resolve),
observation (observed) and batcher as gRPC, so a text scores the same on both transports and
a request counts in the same metrics (methods HttpClassify and HttpInfer).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from textserve.oip import grpc_service_pb2 as oip_pb
from textserve.service.errors import ModelNotFoundError, NotReadyError, ValidationError
from textserve.service.http.app import (
    HttpApp,
    Request,
    Response,
    Route,
    parse_json_object,
    text,
)
from textserve.service.http.jsonify import to_json
from textserve.service.http.tensors import HEADER_LENGTH, parse_infer, render_infer
from textserve.service.metrics import SERVING
from textserve.service.servicers.classifier import build_response
from textserve.service.servicers.oip import EXTENSIONS, server_version
from textserve.service.servicers.oip_codec import INPUT_NAME, decode_request, encode_response
from textserve.service.servicers.oip_describe import model_config, model_metadata, model_statistics
from textserve.service.servicers.resolve import pairs_of, resolve, threshold_of, truncation
from textserve.service.servicers.status import observed
from textserve.v1 import classifier_pb2 as pb

if TYPE_CHECKING:
    from textserve.service.engine.handle import ModelHandle

CLASSIFY = "HttpClassify"  # the `method` label of the metrics
INFER = "HttpInfer"


def _json(document: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(document, separators=(",", ":")).encode())


# -- probes and metrics ---------------------------------------------------------------------------


async def healthz(app: HttpApp, request: Request) -> Response:
    """Live: 200 while the process serves HTTP, draining included."""
    return text(200, "ok")


async def readyz(app: HttpApp, request: Request) -> Response:
    """Ready: 200 only while SERVING (the same state as grpc.health.v1); 503 with the state."""
    state = await app.readiness_of()
    return text(200 if state == SERVING else 503, state)


def local_metrics(registry: CollectorRegistry) -> Callable[[str | None], Awaitable[Response]]:
    """The /metrics page of this process's registry, in the format the scraper accepts."""

    async def page(accept: str | None) -> Response:
        encoder, content_type = choose_encoder(accept or "")
        return Response(200, encoder(registry), content_type.encode())

    return page


async def metrics(app: HttpApp, request: Request) -> Response:
    return await app.metrics_page(request.header("accept"))


# -- KServe v2: server and model metadata ---------------------------------------------------------


async def server_metadata(app: HttpApp, request: Request) -> Response:
    extensions = [*EXTENSIONS, "binary_tensor_data"]
    return _json({"name": "textserve", "version": server_version(), "extensions": extensions})


async def server_live(app: HttpApp, request: Request) -> Response:
    return _json({"live": True})


def _all_ready(app: HttpApp) -> bool:
    names = list(app.ctx.repository.models)
    return bool(names) and all(_ready(app, n, "") for n in names)


async def server_ready(app: HttpApp, request: Request) -> Response:
    """Ready when every model has a version that can take requests (as Triton answers) and the
    server is not draining; 503 otherwise, which probes and tritonclient read as not ready."""
    ready = not app.draining and _all_ready(app)
    return _json({"ready": ready}, 200 if ready else 503)


def _handle(app: HttpApp, request: Request) -> ModelHandle:
    return resolve(app.ctx.repository, request.params["model"], request.params.get("version", ""))


def _ready(app: HttpApp, model: str, version: str) -> bool:
    try:
        resolve(app.ctx.repository, model, version)
    except (ModelNotFoundError, NotReadyError):
        return False
    return True


async def model_ready(app: HttpApp, request: Request) -> Response:
    params = request.params
    ready = _ready(app, params["model"], params.get("version", ""))
    return _json({"name": params["model"], "ready": ready}, 200 if ready else 503)


async def model_metadata_route(app: HttpApp, request: Request) -> Response:
    handle = _handle(app, request)
    record = app.ctx.repository.models.get(handle.name)
    versions = [] if record is None else [v.version for v in record.ready()]
    return _json(to_json(model_metadata(handle, versions)))


async def model_config_route(app: HttpApp, request: Request) -> Response:
    handle = _handle(app, request)
    config = app.ctx.config
    response = model_config(
        handle,
        max_batch_size=config.max_texts_per_request,
        batcher_max_batch_size=config.batcher.max_batch_size,
        max_queue_delay=config.batcher.max_queue_delay,
    )
    return _json(to_json(response.config))


async def model_stats(app: HttpApp, request: Request) -> Response:
    if "model" in request.params:
        handles = [_handle(app, request)]
    else:
        repository = app.ctx.repository
        handles = [resolve(repository, n, "") for n in repository.models if _ready(app, n, "")]
    stats = oip_pb.ModelStatisticsResponse(
        model_stats=[model_statistics(app.ctx.metrics, h.name, str(h.version)) for h in handles]
    )
    return _json(to_json(stats))


# -- inference ------------------------------------------------------------------------------------


async def infer(app: HttpApp, request: Request) -> Response:
    """POST /v2/models/{m}[/versions/{v}]/infer: JSON tensors, or Triton's binary extension."""
    ctx = app.ctx
    params = request.params
    with observed(
        ctx.metrics, INFER, request.deadline, params["model"], context=request,
        telemetry=ctx.telemetry,
    ) as seen:  # fmt: skip
        handle = _handle(app, request)  # NOT_FOUND wins over a bad tensor, as on gRPC
        seen.model = handle.name
        header = request.header(HEADER_LENGTH)
        if header is not None and not header.isdigit():
            raise ValidationError(f"Inference-Header-Content-Length must be a number: {header!r}")
        message, binary = parse_infer(
            request.body, None if header is None else int(header), handle.name, str(handle.version)
        )
        decoded = decode_request(message)
        seen.reached(handle.name, handle.version, decoded.texts)
        try:
            seen.result = result = await handle.classify(
                decoded.texts,
                pairs=decoded.pairs,
                truncate=truncation(decoded.truncate),
                deadline=request.deadline,
                trace=seen.trace,
            )
        except ValidationError as exc:
            raise ValidationError(f"input tensor {INPUT_NAME!r}: {exc}") from None
        response = encode_response(
            decoded,
            result.probabilities,
            handle.labels,
            model_name=handle.name,
            model_version=str(handle.version),
        )
    body, header_length = render_infer(response, binary)
    headers = []
    if header_length != len(body):
        headers.append((HEADER_LENGTH.encode(), str(header_length).encode()))
        return Response(200, body, b"application/octet-stream", headers)
    return Response(200, body)


def _typed(document: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = document.get(name, default)
    if value is None:
        return default
    if kind is int and (type(value) is not int or value < 0 or value >= 2**63):
        raise ValidationError(f"`{name}` must be a non-negative integer, got {value!r}")
    if kind is not int and not isinstance(value, kind):
        raise ValidationError(f"`{name}` must be a {kind.__name__}, got {type(value).__name__}")
    return value


def classify_request(document: dict[str, Any]) -> pb.ClassifyRequest:
    """A /v1/classify body as the textserve.v1 ClassifyRequest it mirrors. Also takes the shape
    Hugging Face clients send: {"inputs": "text" | [...], "parameters": {"top_k": 3}}."""
    texts = document.get("texts")
    options = document
    if texts is None and "inputs" in document:
        texts = document["inputs"]
        texts = [texts] if isinstance(texts, str) else texts
        options = {**document, **_typed(document, "parameters", dict, {})}
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ValidationError("`texts` must be a list of strings")
    request = pb.ClassifyRequest(
        texts=texts,
        id=_typed(options, "id", str, ""),
        model=_typed(options, "model", str, ""),
        version=_typed(options, "version", int, 0),
        top_k=min(_typed(options, "top_k", int, 0), 2**31 - 1),
        all_scores=_typed(options, "all_scores", bool, False),
    )
    truncate = _typed(options, "truncate", bool, None)
    if truncate is not None:
        request.truncate = truncate
    pairs = options.get("text_pairs")
    if pairs is not None:
        if not isinstance(pairs, list) or not all(isinstance(t, str) for t in pairs):
            raise ValidationError("`text_pairs` must be a list of strings")
        request.text_pairs.extend(pairs)
    threshold = options.get("threshold")
    if threshold is not None:
        if type(threshold) not in (int, float):
            raise ValidationError(f"`threshold` must be a number, got {type(threshold).__name__}")
        request.threshold = threshold
    return request


async def classify(app: HttpApp, request: Request) -> Response:
    """POST /v1/classify: textserve.v1 Classify in JSON (the same fields, snake_case)."""
    ctx = app.ctx
    with observed(
        ctx.metrics, CLASSIFY, request.deadline, context=request, telemetry=ctx.telemetry
    ) as seen:
        message = classify_request(parse_json_object(request.body))
        handle = resolve(ctx.repository, message.model, message.version)
        seen.reached(handle.name, handle.version, message.texts)
        truncate = truncation(message.truncate if message.HasField("truncate") else None)
        threshold_of(message, handle)  # a bad threshold costs no inference
        seen.result = result = await handle.classify(
            message.texts,
            pairs=pairs_of(message),
            truncate=truncate,
            deadline=request.deadline,
            trace=seen.trace,
        )
        response = build_response(message, handle, result)
    return _json(to_json(response))


async def openapi(app: HttpApp, request: Request) -> Response:
    from textserve.service.http.openapi import document

    return _json(document())


# -- the route table ------------------------------------------------------------------------------

Methods = dict[str, Route]
PROBE = {"GET": Route(healthz, open=True)}
FIXED: dict[str, Methods] = {
    "/healthz": PROBE,
    "/readyz": {"GET": Route(readyz, open=True)},
    "/metrics": {"GET": Route(metrics)},
    "/openapi.json": {"GET": Route(openapi)},
    "/v2": {"GET": Route(server_metadata)},
    "/v2/health/live": {"GET": Route(server_live, open=True)},
    "/v2/health/ready": {"GET": Route(server_ready, open=True)},
    "/v2/models/stats": {"GET": Route(model_stats)},
    "/v1/classify": {"POST": Route(classify, body=True, inference=True)},
}
# /v2/models/{model}[/versions/{version}]{tail}
MODEL_ROUTES: dict[str, Methods] = {
    "": {"GET": Route(model_metadata_route)},
    "/ready": {"GET": Route(model_ready)},
    "/config": {"GET": Route(model_config_route)},
    "/stats": {"GET": Route(model_stats)},
    "/infer": {"POST": Route(infer, body=True, inference=True)},
}
_MODELS = "/v2/models/"


def matcher() -> Callable[[str], tuple[Methods, dict[str, str]] | None]:
    """path -> (the methods it answers, its path parameters), or None: no such route. Paths
    are exact: no trailing slash, no prefix match (a probe at /readyz/ must not pass)."""

    def match(path: str) -> tuple[Methods, dict[str, str]] | None:
        fixed = FIXED.get(path)
        if fixed is not None:
            return fixed, {}
        if not path.startswith(_MODELS):
            return None
        parts = path[len(_MODELS) :].split("/")
        params = {"model": parts[0]}
        rest = parts[1:]
        if len(rest) >= 2 and rest[0] == "versions":
            params["version"] = rest[1]
            rest = rest[2:]
        if not params["model"] or len(rest) > 1 or params.get("version") == "":
            return None
        methods = MODEL_ROUTES.get("/" + rest[0] if rest else "")
        return None if methods is None else (methods, params)

    return match
