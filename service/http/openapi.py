"""GET /openapi.json: the HTTP routes as an OpenAPI 3.1 document, built from the route table
(routes.py) so that a route cannot be served without being described."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from textserve.service.dataplane.oip import server_version

if TYPE_CHECKING:
    from textserve.service.http.messages import Route

_ERROR = {
    "description": "the taxonomy's error: 400 bad input, 401 no or a wrong token, 404 unknown "
    "model or version, 405 wrong method, 413 body over the limit, 429 queue full, 503 warming "
    "or draining, 504 deadline (Request-Timeout) passed, 500 a server fault",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["error", "code"],
                "properties": {"error": {"type": "string"}, "code": {"type": "string"}},
            }
        }
    },
}
_JSON = {"content": {"application/json": {"schema": {"type": "object"}}}}
_TEXT = {"content": {"text/plain": {"schema": {"type": "string"}}}}
_CLASSIFY_BODY = {
    "type": "object",
    "properties": {
        "texts": {"type": "array", "items": {"type": "string"}},
        "inputs": {
            "description": "Hugging Face style: a text or a list of texts instead of `texts`",
            "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
        },
        "parameters": {"type": "object", "description": "Hugging Face style options"},
        "id": {"type": "string"},
        "model": {"type": "string"},
        "version": {"type": "integer", "minimum": 0},
        "top_k": {"type": "integer", "minimum": 0},
        "truncate": {"type": "boolean"},
        "all_scores": {"type": "boolean"},
    },
}
_SUMMARIES = {
    "/healthz": "liveness: 200 while the process serves",
    "/readyz": "readiness: 200 only while serving, else 503 with the state",
    "/metrics": "Prometheus metrics (OpenMetrics when asked)",
    "/openapi.json": "this document",
    "/v1/classify": "textserve.v1 Classify in JSON",
    "/v2": "KServe v2 server metadata",
    "/v2/": "KServe v2 server metadata (the same, as clients that join paths write it)",
    "/v2/health/live": "KServe v2 server liveness",
    "/v2/health/ready": "KServe v2 server readiness",
    "/v2/models/stats": "Triton statistics of every ready model",
    "/predict": "text-embeddings-inference predict: a text, a pair or a batch -> labels",
    "/rerank": "text-embeddings-inference rerank: a query and texts -> ranks, most relevant first",
    "/v1/rerank": "Cohere (v1) and Jina rerank: query, documents, top_n, return_documents",
    "/v2/rerank": "Cohere (v2) rerank: query, documents, top_n",
    "/classify": "vLLM classify: input -> each label's probability (OpenAI-style list)",
    "/v1/zero-shot": "zero-shot: texts scored against candidate_labels by an NLI model",
    "/v1/tag": "token classification: each text's entities (textserve.v1 Tag in JSON, or the "
    "Hugging Face Inference API's token-classification shape)",
}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_BODIES: dict[str, dict[str, Any]] = {
    "/predict": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "inputs": {
                "description": "a text, a pair [text, text], or a batch of [text] or [text, text]",
                "oneOf": [{"type": "string"}, _STRINGS, {"type": "array", "items": _STRINGS}],
            },
            "truncate": {"type": ["boolean", "null"]},
            "truncation_direction": {"type": "string", "enum": ["Right", "right"]},
            "raw_scores": {"type": "boolean"},
        },
    },
    "/rerank": {
        "type": "object",
        "required": ["query", "texts"],
        "properties": {
            "query": {"type": "string"},
            "texts": _STRINGS,
            "truncate": {"type": ["boolean", "null"]},
            "raw_scores": {"type": "boolean"},
            "return_text": {"type": "boolean"},
        },
    },
    "/v1/rerank": {
        "type": "object",
        "required": ["query", "documents"],
        "properties": {
            "model": {"type": "string"},
            "query": {"type": "string"},
            "documents": {
                "type": "array",
                "items": {
                    "oneOf": [
                        {"type": "string"},
                        {"type": "object", "properties": {"text": {"type": "string"}}},
                    ]
                },
            },
            "top_n": {"type": "integer", "minimum": 0},
            "return_documents": {"type": "boolean"},
            "truncate": {"type": "boolean"},
        },
    },
    "/classify": {
        "type": "object",
        "required": ["input"],
        "properties": {
            "model": {"type": "string"},
            "input": {"oneOf": [{"type": "string"}, _STRINGS]},
        },
    },
}
_BODIES["/v2/rerank"] = _BODIES["/v1/rerank"]
_BODIES["/v1/zero-shot"] = {
    "type": "object",
    "properties": {
        "texts": _STRINGS,
        "inputs": {"description": "Hugging Face style, with `parameters`: a text or a list"},
        "parameters": {"type": "object"},
        "candidate_labels": {"oneOf": [_STRINGS, {"type": "string"}]},
        "hypothesis_template": {"type": "string"},
        "multi_label": {"type": "boolean"},
        "model": {"type": "string"},
        "version": {"type": "integer", "minimum": 0},
        "truncate": {"type": "boolean"},
    },
}
_BODIES["/v1/tag"] = {
    "type": "object",
    "properties": {
        "texts": _STRINGS,
        "inputs": {"description": "Hugging Face style, with `parameters`: a text or a list"},
        "parameters": {"type": "object"},
        "aggregation": {"type": "string", "enum": ["none", "simple", "first", "average", "max"]},
        "ignore_labels": _STRINGS,
        "threshold": {"type": "number", "minimum": 0, "maximum": 1},
        "windows": {"type": "boolean"},
        "stride": {"type": "integer", "minimum": 0},
        "model": {"type": "string"},
        "version": {"type": "integer", "minimum": 0},
        "truncate": {"type": "boolean"},
        "id": {"type": "string"},
    },
}
_BODIES["/v1/classify"] = _CLASSIFY_BODY
_MODEL_SUMMARIES = {
    "": "KServe v2 model metadata",
    "/ready": "KServe v2 model readiness",
    "/config": "Triton model configuration",
    "/stats": "Triton model statistics",
    "/infer": "KServe v2 inference: JSON tensors or Triton's binary tensor extension",
}


def _parameter(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _operation(summary: str, path: str, method: str, open_route: bool) -> dict[str, Any]:
    ok = _TEXT if path in ("/healthz", "/readyz", "/metrics") else _JSON
    operation: dict[str, Any] = {
        "summary": summary,
        "responses": {"200": {"description": "OK", **ok}, "default": _ERROR},
    }
    if open_route:
        operation["security"] = []
    if method == "POST":
        schema = _BODIES.get(path, {"type": "object"})
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
        operation["parameters"] = [
            {
                "name": "Request-Timeout",
                "in": "header",
                "description": "the request's deadline, in seconds",
                "schema": {"type": "number", "exclusiveMinimum": 0},
            }
        ]
    return operation


def document(
    fixed: Mapping[str, Mapping[str, Route]], model_routes: Mapping[str, Mapping[str, Route]]
) -> dict[str, Any]:
    """The OpenAPI document of the routes the HTTP port serves (routes.py's FIXED and
    MODEL_ROUTES: paths, and the tails of /v2/models/{model}[/versions/{version}])."""
    paths: dict[str, Any] = {}
    for path, methods in fixed.items():
        paths[path] = {
            m.lower(): _operation(_SUMMARIES[path], path, m, r.open) for m, r in methods.items()
        }
    for prefix, params in (
        ("/v2/models/{model}", ["model"]),
        ("/v2/models/{model}/versions/{version}", ["model", "version"]),
    ):
        for tail, methods in model_routes.items():
            item: dict[str, Any] = {"parameters": [_parameter(p) for p in params]}
            for m, r in methods.items():
                item[m.lower()] = _operation(_MODEL_SUMMARIES[tail], prefix + tail, m, r.open)
            paths[prefix + tail] = item
    return {
        "openapi": "3.1.0",
        "info": {"title": "textserve", "version": server_version()},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": paths,
    }
