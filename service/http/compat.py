"""The field's HTTP APIs, each a codec over the data plane: what gateways and frameworks already
speak (LangChain, LlamaIndex, litellm, Hugging Face's InferenceClient, the Cohere SDK) reaches a
textserve model without an adapter.

    POST /predict       text-embeddings-inference (TEI): a text, a pair or a batch -> labels
    POST /rerank        TEI: a query and texts -> ranks
    POST /v1/rerank     Cohere (v1) and Jina: a query and documents -> results, top_n
    POST /v2/rerank     Cohere (v2): the same
    POST /classify      vLLM / OpenAI style: `input` -> `data` with each label's probability
    POST /v1/zero-shot  textserve.v1 ZeroShot, or the Hugging Face Inference API's shape
    POST /v1/tag        textserve.v1 Tag (entities), or the Hugging Face Inference API's shape

Each decodes its request into the data plane's call (ClassifyCall, RerankCall), so a text
scores, batches, caches and counts exactly as it does on /v1/classify and over gRPC, and
encodes the answer and every error in its own API's shape (`Route.errors`).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import numpy as np

from textserve.service.dataplane.classify import Classification, ClassifyCall
from textserve.service.dataplane.classify import classify as classify_op
from textserve.service.dataplane.rerank import Ranking, RerankCall, rerank
from textserve.service.dataplane.tag import TagCall, Tagged, pipeline_json, tag, v1_tag_response
from textserve.service.dataplane.zeroshot import (
    DEFAULT_TEMPLATE,
    ZeroShot,
    ZeroShotCall,
    v1_zero_shot_response,
    zero_shot,
)
from textserve.service.engine.inference import Cut, logits_of
from textserve.service.errors import ValidationError
from textserve.service.http.jsonify import to_json
from textserve.service.http.messages import (
    AppView,
    Request,
    Response,
    Route,
    parse_json_object,
    typed,
    unicode_text,
    windows_field,
)

CLASSIFY = "HttpClassify"  # the `method` label of the metrics
RERANK = "HttpRerank"
ZERO_SHOT = "HttpZeroShot"
TAG = "HttpTag"


def _json(document: Any) -> Response:
    return Response(200, json.dumps(document, separators=(",", ":")).encode())


# -- decoding helpers -----------------------------------------------------------------------------


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{where} must be a string, got {type(value).__name__}")
    return unicode_text(value, where)


def _model(document: dict[str, Any]) -> str:
    """The request's `model` ("" or absent: the default model; TEI's routes take it too)."""
    return _text(typed(document, "model", str, ""), "`model`")


def _direction(document: dict[str, Any]) -> Cut | None:
    """TEI's `truncation_direction` ("Right", the default, or "Left": keep a long text's end)."""
    direction = document.get("truncation_direction")
    if direction is None:
        return None
    if not isinstance(direction, str) or direction.lower() not in ("right", "left"):
        raise ValidationError(
            f'`truncation_direction` must be "Right" or "Left", got {str(direction)[:40]!r}'
        )
    return Cut(side=direction.lower())


def _positive(document: dict[str, Any], name: str) -> int | None:
    value = document.get(name)
    if value is None:
        return None
    if type(value) is not int or not 0 < value < 2**31:
        raise ValidationError(f"`{name}` must be a positive integer, got {str(value)[:40]}")
    return value


# -- text-embeddings-inference --------------------------------------------------------------------

TEI_ERROR_TYPES = {
    "RESOURCE_EXHAUSTED": "Overloaded",
    "DEADLINE_EXCEEDED": "Overloaded",
    "UNAVAILABLE": "Unhealthy",
    "INTERNAL": "Backend",
    "UNKNOWN": "Backend",
}


def tei_error(status: int, message: str, code: str) -> bytes:
    """TEI's error body: {"error": ..., "error_type": Validation | Overloaded | ...}."""
    kind = TEI_ERROR_TYPES.get(code, "Validation" if status < 500 else "Backend")
    return json.dumps({"error": message, "error_type": kind}).encode()


def tei_inputs(inputs: Any) -> tuple[list[str], list[str | None] | None, bool]:
    """TEI's `inputs`: a text, a pair [a, b], or a batch of [a] and [a, b] -> (texts, pairs or
    None, whether it was a batch); in a batch that mixes single texts and pairs, a single
    text's pair is None."""
    if isinstance(inputs, str):
        return [_text(inputs, "`inputs`")], None, False
    if not isinstance(inputs, list) or not inputs:
        raise ValidationError("`inputs` must be a text, a pair of texts or a non-empty batch")
    if all(isinstance(one, str) for one in inputs):
        if len(inputs) != 2:
            raise ValidationError(
                "`inputs` as a list of texts is a pair and takes two; a batch is a list of "
                '[text] or [text, text] lists: {"inputs": [["a"], ["b"]]}'
            )
        return [_text(inputs[0], "`inputs[0]`")], [_text(inputs[1], "`inputs[1]`")], False
    texts: list[str] = []
    seconds: list[str | None] = []
    for index, one in enumerate(inputs):
        if not isinstance(one, list) or len(one) not in (1, 2):
            raise ValidationError(f"`inputs[{index}]` must be [text] or [text, text]")
        texts.append(_text(one[0], f"`inputs[{index}][0]`"))
        seconds.append(_text(one[1], f"`inputs[{index}][1]`") if len(one) == 2 else None)
    return texts, seconds if any(s is not None for s in seconds) else None, True


async def tei_predict(app: AppView, request: Request) -> Response:
    """POST /predict: every label with its score, best first, per input."""
    document = parse_json_object(request.body)
    if "inputs" not in document:
        raise ValidationError("`inputs` is missing")
    texts, pairs, batch = tei_inputs(document["inputs"])
    raw_scores = typed(document, "raw_scores", bool, False)
    call = ClassifyCall(
        texts,
        pairs,
        model=_model(document),
        truncate=typed(document, "truncate", bool, None),
        cut=_direction(document),
    )

    def encode(answer: Classification) -> Response:
        result = answer.result
        probs = result.probabilities
        scores = probs
        if raw_scores:  # the graph's logits; derived from the scores for cached answers
            logits = result.logits
            activation = answer.handle.manifest.activation
            scores = logits_of(probs, activation) if logits is None else logits
        order = np.argsort(-probs, axis=1, kind="stable").tolist()
        labels, rows = answer.handle.labels, scores.astype(np.float64).tolist()
        out = [
            [{"score": row[j], "label": labels[j]} for j in best]
            for best, row in zip(order, rows, strict=True)
        ]
        return _json(out if batch else out[0])

    return await classify_op(
        app.ctx, call, encode, method=CLASSIFY, deadline=request.deadline, context=request
    )


def _texts(value: Any, name: str) -> list[str]:
    if not isinstance(value, list):
        raise ValidationError(f"`{name}` must be a list of strings")
    return [_text(one, f"`{name}[{i}]`") for i, one in enumerate(value)]


async def tei_rerank(app: AppView, request: Request) -> Response:
    """POST /rerank: each text's relevance to the query, most relevant first."""
    document = parse_json_object(request.body)
    texts = _texts(document.get("texts"), "texts")
    call = RerankCall(
        _text(document.get("query"), "`query`"),
        texts,
        model=_model(document),
        truncate=typed(document, "truncate", bool, None),
        raw_scores=typed(document, "raw_scores", bool, False),
        return_documents=typed(document, "return_text", bool, False),
        windows=windows_field(document, "max"),
        cut=_direction(document),
    )

    def encode(ranking: Ranking) -> Response:
        ranks = []
        for i in ranking.order:
            rank: dict[str, Any] = {"index": i, "score": ranking.scores[i]}
            if call.return_documents:
                rank["text"] = texts[i]
            ranks.append(rank)
        return _json(ranks)

    return await rerank(
        app.ctx, call, encode, method=RERANK, deadline=request.deadline, context=request
    )


# -- Cohere and Jina ------------------------------------------------------------------------------


def cohere_error(status: int, message: str, code: str) -> bytes:
    """Cohere's error body {"message"}, with Jina's {"detail"} beside it."""
    return json.dumps({"message": message, "detail": message}).encode()


def _documents(value: Any) -> list[str]:
    """Cohere's and Jina's `documents`: strings or {"text": ...} objects."""
    if not isinstance(value, list):
        raise ValidationError('`documents` must be a list of strings or {"text": ...} objects')
    out = []
    for index, one in enumerate(value):
        if isinstance(one, dict):
            one = one.get("text")
        out.append(_text(one, f"`documents[{index}]` (or its `text`)"))
    return out


async def cohere_rerank(app: AppView, request: Request) -> Response:
    """POST /v1/rerank and /v2/rerank: Cohere's and Jina's rerank."""
    document = parse_json_object(request.body)
    documents = _documents(document.get("documents"))
    per_doc = _positive(document, "max_tokens_per_doc")
    call = RerankCall(
        _text(document.get("query"), "`query`"),
        documents,
        model=_model(document),
        truncate=typed(document, "truncate", bool, None),
        top_n=typed(document, "top_n", int, 0),
        return_documents=typed(document, "return_documents", bool, False),
        windows=windows_field(document, "max"),
        cut=None if per_doc is None else Cut(document_tokens=per_doc),
    )

    def encode(ranking: Ranking) -> Response:
        results = []
        for i in ranking.order:
            result: dict[str, Any] = {"index": i, "relevance_score": ranking.scores[i]}
            if call.return_documents:
                result["document"] = {"text": documents[i]}
            results.append(result)
        return _json(
            {
                "id": str(uuid.uuid4()),
                "model": ranking.handle.name,
                "results": results,
                "meta": {"billed_units": {"search_units": 1}},
                "usage": {"total_tokens": sum(ranking.num_tokens)},
            }
        )

    return await rerank(
        app.ctx, call, encode, method=RERANK, deadline=request.deadline, context=request
    )


# -- vLLM / OpenAI style --------------------------------------------------------------------------

OPENAI_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    413: "BadRequestError",
    429: "RateLimitError",
    503: "ServiceUnavailableError",
    504: "TimeoutError",
}


def openai_error(status: int, message: str, code: str) -> bytes:
    """OpenAI's (and vLLM's) error body: {"error": {"message", "type", "param", "code"}}."""
    kind = OPENAI_ERROR_TYPES.get(status, "InternalServerError")
    error = {"message": message, "type": kind, "param": None, "code": status}
    return json.dumps({"error": error}).encode()


def _prompt_tokens(document: dict[str, Any]) -> Cut | None:
    """vLLM's `truncate_prompt_tokens`: keep a text's last k tokens (special tokens included);
    -1: as many as the model takes."""
    value = document.get("truncate_prompt_tokens")
    if value is None:
        return None
    if value == -1 and type(value) is int:
        return Cut(side="left")
    keep = _positive(document, "truncate_prompt_tokens")
    return Cut(max_tokens=keep, side="left")


async def vllm_classify(app: AppView, request: Request) -> Response:
    """POST /classify: vLLM's classification API (`model`, `input`)."""
    document = parse_json_object(request.body)
    inputs = document.get("input")
    single = isinstance(inputs, str)
    texts = [_text(inputs, "`input`")] if single else _texts(inputs, "input")
    call = ClassifyCall(texts, model=_model(document), cut=_prompt_tokens(document))

    def encode(answer: Classification) -> Response:
        probs = answer.result.probabilities
        labels = answer.handle.labels
        best = probs.argmax(axis=1).tolist()
        tokens = int(answer.result.num_tokens.sum())
        data = [
            {"index": i, "label": labels[b], "probs": row, "num_classes": len(labels)}
            for i, (b, row) in enumerate(zip(best, probs.astype(np.float64).tolist(), strict=True))
        ]
        return _json(
            {
                "id": f"classify-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": answer.handle.name,
                "data": data,
                "usage": {
                    "prompt_tokens": tokens,
                    "total_tokens": tokens,
                    "completion_tokens": 0,
                    "prompt_tokens_details": None,
                },
            }
        )

    return await classify_op(
        app.ctx, call, encode, method=CLASSIFY, deadline=request.deadline, context=request
    )


# -- zero-shot (textserve.v1 ZeroShot in JSON, and the Hugging Face Inference API's shape) ------


def _candidates(value: Any) -> list[str]:
    """`candidate_labels`: a list of strings, or one string of comma-separated labels (as the
    Hugging Face Inference API takes it)."""
    if isinstance(value, str):
        value = [label.strip() for label in value.split(",")]
    return _texts(value, "candidate_labels")


def _inputs(document: dict[str, Any]) -> tuple[list[str], dict[str, Any], bool]:
    """A body's texts and options: textserve's ({"texts", ...options}) or the Hugging Face
    Inference API's ({"inputs": a text or a list, "parameters": {...options}}, True)."""
    if "texts" in document or "inputs" not in document:
        return _texts(document.get("texts"), "texts"), document, False
    inputs = document["inputs"]
    texts = [_text(inputs, "`inputs`")] if isinstance(inputs, str) else _texts(inputs, "inputs")
    return texts, {**document, **typed(document, "parameters", dict, {})}, True


async def zero_shot_route(app: AppView, request: Request) -> Response:
    """POST /v1/zero-shot: {"texts", "candidate_labels", ...} answers ZeroShotResponse's JSON;
    {"inputs", "parameters": {"candidate_labels", ...}} answers as the Hugging Face Inference
    API does: [{"label", "score"}, ...] best first (a list of them per text for a list)."""
    document = parse_json_object(request.body)
    texts, options, hugging_face = _inputs(document)
    call = ZeroShotCall(
        texts,
        _candidates(options.get("candidate_labels")),
        _text(
            typed(options, "hypothesis_template", str, DEFAULT_TEMPLATE), "`hypothesis_template`"
        ),
        typed(options, "multi_label", bool, False),
        model=_model(options),
        version=typed(options, "version", int, 0),
        truncate=typed(options, "truncate", bool, None),
        id=_text(typed(options, "id", str, ""), "`id`"),
    )

    def encode(answer: ZeroShot) -> Response:
        if not hugging_face:
            return _json(to_json(v1_zero_shot_response(answer)))
        labels = call.candidate_labels
        out = [
            [{"label": labels[i], "score": scores[i]} for i in order]
            for order, scores in zip(answer.order, answer.scores, strict=True)
        ]
        return _json(out[0] if isinstance(document["inputs"], str) else out)

    return await zero_shot(
        app.ctx, call, encode, method=ZERO_SHOT, deadline=request.deadline, context=request
    )


# -- token classification (textserve.v1 Tag in JSON, and the Hugging Face Inference API's shape) -


def _threshold(value: Any) -> float:
    if value is None:
        return 0.0
    if type(value) not in (int, float):
        raise ValidationError(f"`threshold` must be a number, got {type(value).__name__}")
    return float(value)


async def tag_route(app: AppView, request: Request) -> Response:
    """POST /v1/tag: {"texts", "aggregation", ...} answers TagResponse's JSON; {"inputs",
    "parameters": {"aggregation_strategy", "ignore_labels", "stride"}} answers as the Hugging
    Face Inference API (and transformers' pipeline) does: [{"entity_group", "score", "word",
    "start", "end"}, ...] (a list of them per text for a list of inputs)."""
    document = parse_json_object(request.body)
    texts, options, hugging_face = _inputs(document)
    if hugging_face and "aggregation_strategy" in options:
        options["aggregation"] = options["aggregation_strategy"]
    ignore = options.get("ignore_labels")
    call = TagCall(
        texts,
        model=_model(options),
        version=typed(options, "version", int, 0),
        aggregation=_text(typed(options, "aggregation", str, ""), "`aggregation`").lower(),
        ignore_labels=None if ignore is None else _texts(ignore, "ignore_labels"),
        threshold=_threshold(options.get("threshold")),
        windows=typed(options, "windows", bool, None),
        stride=typed(options, "stride", int, None),
        truncate=typed(options, "truncate", bool, None),
        id=_text(typed(options, "id", str, ""), "`id`"),
    )

    def encode(answer: Tagged) -> Response:
        if not hugging_face:
            return _json(to_json(v1_tag_response(answer)))
        out = pipeline_json(answer)
        return _json(out[0] if isinstance(document["inputs"], str) else out)

    return await tag(app.ctx, call, encode, method=TAG, deadline=request.deadline, context=request)


ROUTES: dict[str, dict[str, Route]] = {
    "/predict": {"POST": Route(tei_predict, body=True, method=CLASSIFY, errors=tei_error)},
    "/rerank": {"POST": Route(tei_rerank, body=True, method=RERANK, errors=tei_error)},
    "/v1/rerank": {"POST": Route(cohere_rerank, body=True, method=RERANK, errors=cohere_error)},
    "/v2/rerank": {"POST": Route(cohere_rerank, body=True, method=RERANK, errors=cohere_error)},
    "/classify": {"POST": Route(vllm_classify, body=True, method=CLASSIFY, errors=openai_error)},
    "/v1/zero-shot": {"POST": Route(zero_shot_route, body=True, method=ZERO_SHOT)},
    "/v1/tag": {"POST": Route(tag_route, body=True, method=TAG)},
}
