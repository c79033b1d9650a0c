"""Tag, transport-neutral: a token classifier's entities per text (textserve.tagging).

    call = TagCall(["Ada Lovelace met Charles Babbage"], model="ner", aggregation="first")
    body = await tag(ctx, call, v1_tag_response, method="Tag", deadline=d, context=c)

A front end (gRPC textserve.v1 Tag and TagStream, HTTP /v1/tag, the KServe v2 ENTITIES output)
decodes its request into a `TagCall`, calls `tag` and encodes the `Tagged` answer. The request's
options are checked against the version the prologue picked (request_of) before any text runs:
an unknown aggregation, a stride the model's windows leave no room for, or a model that is not a
token classifier are INVALID_ARGUMENT naming what to send instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from textserve.artifact import shown
from textserve.service.dataplane.classify import timing
from textserve.service.dataplane.observe import Seen, observed
from textserve.service.dataplane.prologue import resolve, truncation
from textserve.service.engine.token_runner import TagRequest, TokenRunner
from textserve.service.errors import ValidationError
from textserve.tagging import STRATEGIES, TagOptions
from textserve.v1 import classifier_pb2 as pb

if TYPE_CHECKING:
    from textserve.service.dataplane.context import ServingContext
    from textserve.service.engine.handle import ModelHandle
    from textserve.service.engine.token_runner import TagResult

T = TypeVar("T")
MAX_IGNORED = 1024


class TagCall(NamedTuple):
    texts: Sequence[str]
    model: str = ""
    version: int | str | None = None
    aggregation: str = ""  # "": the model's default
    ignore_labels: Sequence[str] | None = None  # None: the model's default
    threshold: float = 0.0
    windows: bool | None = None  # None: the model's default (on when its stride is set)
    stride: int | None = None  # None: the model's default
    truncate: bool | None = None
    id: str = ""


class Tagged(NamedTuple):
    call: TagCall
    handle: ModelHandle
    result: TagResult


def token_runner(handle: ModelHandle) -> TokenRunner:
    """The handle's TokenRunner; ValidationError for a sequence classifier."""
    runner = handle.runner
    if not isinstance(runner, TokenRunner):
        raise ValidationError(
            f"model {shown(handle.name)} is a sequence classifier (one label per text): send "
            "it to Classify (POST /v1/classify); Tag is for token classifiers"
        )
    return runner


def request_of(handle: ModelHandle, call: TagCall) -> TagRequest:
    """The runner's options for `call` on `handle`: the call's, else the model's defaults."""
    runner = token_runner(handle)
    defaults = runner.defaults
    aggregation = call.aggregation or defaults.options.aggregation
    if aggregation not in STRATEGIES:
        raise ValidationError(
            f"aggregation {shown(aggregation)} is not one of {', '.join(STRATEGIES)}"
        )
    ignore = defaults.options.ignore_labels
    if call.ignore_labels is not None:
        if len(call.ignore_labels) > MAX_IGNORED:
            raise ValidationError(f"ignore_labels: at most {MAX_IGNORED} labels")
        ignore = frozenset(call.ignore_labels)
    if not (math.isfinite(call.threshold) and 0.0 <= call.threshold <= 1.0):
        raise ValidationError(f"threshold must be within [0, 1], got {call.threshold}")
    stride = call.stride if call.stride is not None else defaults.stride
    if call.windows is False:
        stride = None
    elif call.windows and stride is None:
        stride = runner.max_length // 4
    if stride is not None:
        if not 0 <= stride <= runner.max_stride():
            raise ValidationError(
                f"stride {stride} leaves no room in model {shown(handle.name)}'s windows of "
                f"{runner.max_length} tokens: at most {runner.max_stride()}"
            )
        if aggregation == "none":
            raise ValidationError(
                "aggregation 'none' reports tokens by their position in one window and cannot "
                "merge windows (as transformers' pipeline refuses stride with it): send "
                "windows=false to cut long texts, or another aggregation"
            )
    return TagRequest(TagOptions(aggregation, ignore, call.threshold), stride)


def prologue(ctx: ServingContext, call: TagCall, seen: Seen) -> tuple[ModelHandle, TagRequest]:
    """THE tag prologue (unary Tag, each TagStream message, /v1/tag): the version, then the
    request's options checked against it; `seen` learns the model reached."""
    handle = resolve(ctx.repository, call.model, call.version)
    seen.reached(handle.name, handle.version, call.texts)
    return handle, request_of(handle, call)


async def tag(
    ctx: ServingContext,
    call: TagCall,
    encode: Callable[[Tagged], T],
    *,
    method: str,
    deadline: float | None,
    context: Any = None,
) -> T:
    """Tag `call`'s texts and return `encode(tagged)`; observed as `method`."""
    with observed(ctx.metrics, method, deadline, context=context, telemetry=ctx.telemetry) as seen:
        handle, request = prologue(ctx, call, seen)
        result = await handle.tag(
            call.texts,
            request,
            truncate=truncation(call.truncate),
            deadline=deadline,
            trace=seen.trace,
        )
        seen.result = result  # type: ignore[assignment]  # (its num_tokens and timings)
        return encode(Tagged(call, handle, result))


def v1_tag_response(answer: Tagged) -> pb.TagResponse:
    """The textserve.v1 TagResponse (what gRPC sends, HTTP its JSON)."""
    call, handle, result = answer
    response = pb.TagResponse(id=call.id, model=handle.name, model_version=handle.version)
    add = response.results.add
    num_tokens = result.num_tokens.tolist()
    truncated = result.truncated.tolist()
    windows = result.windows.tolist()
    for i, entities in enumerate(result.entities):
        text = add(num_tokens=num_tokens[i], truncated=truncated[i], windows=windows[i])
        for entity in entities:
            item = text.entities.add(
                label=entity.label,
                score=entity.score,
                word=entity.word,
                start=entity.start,
                end=entity.end,
            )
            if entity.token >= 0:
                item.index = entity.token
    timing(response.timing, result.timings)
    return response


def pipeline_json(answer: Tagged) -> list[list[dict[str, object]]]:
    """Each text's entities as transformers' pipeline returns them (entity_group or entity,
    score, word, start, end, and index for 'none'): the KServe v2 ENTITIES output's JSON."""
    return [[entity.as_dict() for entity in entities] for entities in answer.result.entities]
