"""The HTTP routes, an HTTP codec over the data plane: the probes, /metrics, KServe v2 REST,
POST /v1/classify, and the field's APIs (compat.py: TEI, Cohere/Jina, vLLM).

Each handler takes (app, request), decodes it, calls the data plane (dataplane.classify,
dataplane.oip) and encodes its answer as a Response; errors are the taxonomy's exceptions,
answered by app.py with their status. The operations are the very ones the gRPC servicers call,
so a text scores the same on both transports and a request counts in the same metrics
(methods HttpClassify and HttpInfer).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from textserve.service.dataplane import oip
from textserve.service.dataplane.classify import Classification, ClassifyCall, v1_response
from textserve.service.dataplane.classify import classify as classify_call_op
from textserve.service.errors import ValidationError
from textserve.service.http import compat
from textserve.service.http.jsonify import to_json
from textserve.service.http.messages import (
    AppView,
    Request,
    Response,
    Route,
    parse_json_object,
    text,
    typed,
    unicode_text,
    windows_field,
)
from textserve.service.http.openapi import document
from textserve.service.http.tensors import HEADER_LENGTH, parse_infer, render_infer
from textserve.service.metrics import SERVING

if TYPE_CHECKING:
    from textserve.service.engine.handle import ModelHandle

CLASSIFY = "HttpClassify"  # the `method` label of the metrics
INFER = "HttpInfer"


def _json(document: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(document, separators=(",", ":")).encode())


# -- probes and metrics ---------------------------------------------------------------------------


async def healthz(app: AppView, request: Request) -> Response:
    """Live: 200 while the process serves HTTP, draining included."""
    return text(200, "ok")


async def readyz(app: AppView, request: Request) -> Response:
    """Ready: 200 only while SERVING (the same state as grpc.health.v1); 503 with the state."""
    state = await app.readiness_of()
    return text(200 if state == SERVING else 503, state)


def local_metrics(registry: CollectorRegistry) -> Callable[[str | None], Awaitable[Response]]:
    """The /metrics page of this process's registry, in the format the scraper accepts.

    Rendered on a worker thread, not on the event loop (a page of every series is ~20 ms of
    Python: on the loop it stalled every request for that long), and once for all the scrapes
    that ask while it is being rendered (16 scrapers cost one render, not 16); never kept past
    that, so a scrape that finds no render under way sees everything answered before it."""
    rendering: dict[str, asyncio.Future[bytes]] = {}  # content type -> the render under way

    async def page(accept: str | None) -> Response:
        encoder, content_type = choose_encoder(accept or "")
        render = rendering.get(content_type)
        if render is None:
            render = asyncio.ensure_future(asyncio.to_thread(encoder, registry))
            rendering[content_type] = render
            render.add_done_callback(lambda _: rendering.pop(content_type, None))
        # shielded: a scraper that hangs up does not cancel the render the others wait for
        return Response(200, await asyncio.shield(render), content_type.encode())

    return page


async def metrics(app: AppView, request: Request) -> Response:
    return await app.metrics_page(request.header("accept"))


# -- KServe v2: server and model metadata ---------------------------------------------------------


async def server_metadata(app: AppView, request: Request) -> Response:
    document = to_json(oip.server_metadata())
    document["extensions"] = [*document["extensions"], "binary_tensor_data"]
    return _json(document)


async def server_live(app: AppView, request: Request) -> Response:
    return _json({"live": True})


async def server_ready(app: AppView, request: Request) -> Response:
    """Ready when every model has a version that can take requests (as Triton answers) and the
    server is not draining; 503 otherwise, which probes and tritonclient read as not ready."""
    ready = not app.draining and oip.server_ready(app.ctx)
    return _json({"ready": ready}, 200 if ready else 503)


async def model_ready(app: AppView, request: Request) -> Response:
    params = request.params
    ready = oip.model_ready(app.ctx, params["model"], params.get("version", ""))
    return _json({"name": params["model"], "ready": ready}, 200 if ready else 503)


async def model_metadata_route(app: AppView, request: Request) -> Response:
    params = request.params
    return _json(to_json(oip.metadata_of(app.ctx, params["model"], params.get("version", ""))))


async def model_config_route(app: AppView, request: Request) -> Response:
    params = request.params
    response = oip.model_config_of(app.ctx, params["model"], params.get("version", ""))
    return _json(to_json(response.config))


async def model_stats(app: AppView, request: Request) -> Response:
    params = request.params
    stats = oip.statistics_of(app.ctx, params.get("model", ""), params.get("version", ""))
    return _json(to_json(stats))


# -- inference ------------------------------------------------------------------------------------


def _content_length(header: str | None) -> int | None:
    """Inference-Header-Content-Length as a number of bytes: ASCII digits only (str.isdigit
    also takes '²', which int() then refuses: a 500 before this check)."""
    if header is None:
        return None
    if not (header.isascii() and header.isdigit()):
        raise ValidationError(f"{HEADER_LENGTH} must be a number: {header[:40]!r}")
    return int(header)


async def infer(app: AppView, request: Request) -> Response:
    """POST /v2/models/{m}[/versions/{v}]/infer: JSON tensors, or Triton's binary extension."""
    params = request.params
    binary: dict[str, bool] = {}  # which outputs the caller wants as binary (parse_infer's)

    def parse(handle: ModelHandle) -> Any:
        nonlocal binary
        length = _content_length(request.header(HEADER_LENGTH))
        message, binary = parse_infer(request.body, length, handle.name, str(handle.version))
        return message

    response = await oip.infer(
        app.ctx,
        params["model"],
        params.get("version", ""),
        parse,
        method=INFER,
        deadline=request.deadline,
        context=request,
    )
    body, header_length = render_infer(response, binary)
    headers = []
    if header_length != len(body):
        headers.append((HEADER_LENGTH.encode(), str(header_length).encode()))
        return Response(200, body, b"application/octet-stream", headers)
    return Response(200, body)


def classify_call(document: dict[str, Any]) -> ClassifyCall:
    """A /v1/classify body as the data plane's call (the fields of textserve.v1's
    ClassifyRequest, snake_case). Also takes the shape Hugging Face clients send:
    {"inputs": "text" | [...], "parameters": {"top_k": 3}}."""
    texts = document.get("texts")
    options = document
    if texts is None and "inputs" in document:
        texts = document["inputs"]
        texts = [texts] if isinstance(texts, str) else texts
        options = {**document, **typed(document, "parameters", dict, {})}
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ValidationError("`texts` must be a list of strings")
    for index, one in enumerate(texts):
        unicode_text(one, f"texts[{index}]")
    pairs = options.get("text_pairs")
    if pairs is not None:
        if not isinstance(pairs, list) or not all(isinstance(t, str) for t in pairs):
            raise ValidationError("`text_pairs` must be a list of strings")
        for index, one in enumerate(pairs):
            unicode_text(one, f"text_pairs[{index}]")
        pairs = pairs or None  # an empty list: single texts, as textserve.v1 reads it
    threshold = options.get("threshold")
    if threshold is not None:
        if type(threshold) not in (int, float):
            raise ValidationError(f"`threshold` must be a number, got {type(threshold).__name__}")
        threshold = _float32(float(threshold))
    return ClassifyCall(
        texts,
        pairs,
        model=unicode_text(typed(options, "model", str, ""), "`model`"),
        version=typed(options, "version", int, 0),
        truncate=typed(options, "truncate", bool, None),
        threshold=threshold,
        top_k=min(typed(options, "top_k", int, 0), 2**31 - 1),
        all_scores=typed(options, "all_scores", bool, False),
        id=unicode_text(typed(options, "id", str, ""), "`id`"),
        windows=windows_field(options, "mean"),
    )


def _float32(value: float) -> float:
    """`value` as textserve.v1's float field holds it (what gRPC callers' thresholds are)."""
    with np.errstate(over="ignore"):  # past float32's range: infinite, refused as out of range
        return float(np.float32(value)) if math.isfinite(value) else value


def _v1_json(answer: Classification) -> Response:
    return _json(to_json(v1_response(answer)))


async def classify(app: AppView, request: Request) -> Response:
    """POST /v1/classify: textserve.v1 Classify in JSON (the same fields, snake_case)."""
    return await classify_call_op(
        app.ctx,
        classify_call(parse_json_object(request.body)),
        _v1_json,
        method=CLASSIFY,
        deadline=request.deadline,
        context=request,
    )


async def openapi(app: AppView, request: Request) -> Response:
    global _OPENAPI
    if _OPENAPI is None:  # built once: the routes are fixed
        _OPENAPI = _json(document(FIXED, MODEL_ROUTES)).body
    return Response(200, _OPENAPI)


_OPENAPI: bytes | None = None


# -- the route table ------------------------------------------------------------------------------

Methods = dict[str, Route]
PROBE = {"GET": Route(healthz, open=True)}
FIXED: dict[str, Methods] = {
    "/healthz": PROBE,
    "/readyz": {"GET": Route(readyz, open=True)},
    "/metrics": {"GET": Route(metrics)},
    "/openapi.json": {"GET": Route(openapi)},
    "/v2": {"GET": Route(server_metadata)},
    "/v2/": {"GET": Route(server_metadata)},
    "/v2/health/live": {"GET": Route(server_live, open=True)},
    "/v2/health/ready": {"GET": Route(server_ready, open=True)},
    "/v2/models/stats": {"GET": Route(model_stats)},
    "/v1/classify": {"POST": Route(classify, body=True, method=CLASSIFY)},
    **compat.ROUTES,  # TEI, Cohere/Jina and vLLM shapes over the same data plane
}
# /v2/models/{model}[/versions/{version}]{tail}
MODEL_ROUTES: dict[str, Methods] = {
    "": {"GET": Route(model_metadata_route)},
    "/ready": {"GET": Route(model_ready)},
    "/config": {"GET": Route(model_config_route)},
    "/stats": {"GET": Route(model_stats)},
    "/infer": {"POST": Route(infer, body=True, method=INFER)},
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
