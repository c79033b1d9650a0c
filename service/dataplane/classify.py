"""Classify, transport-neutral: the call as one typed value, ONE prologue, the answer encoded.

    call = ClassifyCall(texts=["a fine film"], model="default", top_k=2)     # a codec decodes
    body = await classify(ctx, call, v1_response, method="Classify", deadline=d, context=c)

A front end (gRPC textserve.v1 unary and stream, HTTP /v1/classify) decodes its request into a
`ClassifyCall`, calls `classify` (or, for a stream's many requests in flight, `prologue` and the
handle's `classify_nowait`) and encodes the `Classification` it gets back: `v1_response` builds
the textserve.v1 ClassifyResponse message that gRPC sends as it is and HTTP as JSON. The
request is observed (counted with its final code, traced, access-logged) from before the
prologue until its answer is encoded, so the latency histogram holds the whole request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np

from textserve.service.dataplane.observe import Seen, observed
from textserve.service.dataplane.prologue import decision_threshold, resolve, truncation
from textserve.service.dataplane.windows import classify_windows, in_force
from textserve.service.engine.inference import Cut
from textserve.service.engine.window_options import Windows
from textserve.service.errors import ValidationError
from textserve.v1 import classifier_pb2 as pb

if TYPE_CHECKING:
    from textserve.service.dataplane.context import ServingContext
    from textserve.service.engine.handle import ClassifyResult, ModelHandle, Timings

T = TypeVar("T")


class ClassifyCall(NamedTuple):
    """One classify request, whichever way it came (a NamedTuple: built per request, cheaply)."""

    texts: Sequence[str]
    # each text's second text (sentence pairs; None for a single text in a mixed batch), or None
    pairs: Sequence[str | None] | None = None
    model: str = ""  # "": the default model
    version: int | str | None = None  # 0, "" or None: the newest ready version
    truncate: bool | None = None  # None: the default (prologue.DEFAULT_TRUNCATE)
    threshold: float | None = None  # multi-label models: the request's decision threshold
    top_k: int = 0  # the k best labels per text with their scores; 0: none
    all_scores: bool = False  # every label's score per text
    id: str = ""  # echoed in the answer
    windows: Windows | None = None  # long texts split into windows, not cut (windows.py)
    cut: Cut | None = None  # the request's own truncation (TEI, vLLM, Cohere options)


class Prepared(NamedTuple):
    """What the prologue decided for a call: the version that serves it and how."""

    handle: ModelHandle
    truncate: bool
    threshold: float | None  # multi-label models: the decision threshold; None otherwise


class Classification(NamedTuple):
    """A call's answer before encoding: the call, the version that served it, its result."""

    call: ClassifyCall
    handle: ModelHandle
    result: ClassifyResult
    threshold: float | None


def prologue(ctx: ServingContext, call: ClassifyCall, seen: Seen) -> Prepared:
    """THE classify prologue: the version (ModelNotFoundError, NotReadyError), the truncation,
    the threshold (ValidationError before any inference); `seen` learns the model reached."""
    handle = resolve(ctx.repository, call.model, call.version)
    seen.reached(handle.name, handle.version, call.texts)
    return Prepared(handle, truncation(call.truncate), decision_threshold(handle, call.threshold))


async def classify(
    ctx: ServingContext,
    call: ClassifyCall,
    encode: Callable[[Classification], T],
    *,
    method: str,
    deadline: float | None,
    context: Any = None,
    admit: Callable[[ModelHandle], object] | None = None,
) -> T:
    """Classify `call`'s texts and return `encode(classification)`; observed as `method`.
    `admit`: an operation's own check of the version the prologue picked (rerank: a
    cross-encoder; zero-shot: an NLI model), raising before any text runs.
    Raises the taxonomy of service/errors.py (each codec maps it to its own status)."""
    with observed(ctx.metrics, method, deadline, context=context, telemetry=ctx.telemetry) as seen:
        handle, truncate, threshold = prologue(ctx, call, seen)
        if admit is not None:
            admit(handle)
        windows = None if call.cut is not None else in_force(ctx, call.windows, handle.name)
        if windows is not None and call.pairs is not None and None in call.pairs:
            raise ValidationError(
                "windows do not take a batch that mixes single texts and pairs: send each kind "
                "in a request of its own, or leave windows off"
            )
        if windows is None:
            seen.result = result = await handle.classify(
                call.texts, pairs=call.pairs, truncate=truncate, deadline=deadline,
                trace=seen.trace, cut=call.cut,
            )  # fmt: skip
        else:
            pairs = None if call.pairs is None else [p or "" for p in call.pairs]  # (no None)
            seen.result = result = await classify_windows(
                handle, call.texts, pairs, windows, deadline=deadline, trace=seen.trace
            )
        return encode(Classification(call, handle, result, threshold))


def v1_response(answer: Classification) -> pb.ClassifyResponse:
    """The textserve.v1 ClassifyResponse of an answer (gRPC sends it, HTTP its JSON)."""
    call, handle, result, threshold = answer
    probs = result.probabilities
    labels = handle.labels
    # multi-label: per text, the labels whose own score reaches the threshold (label order)
    passing = None if threshold is None else (probs >= threshold).tolist()
    # Python lists up front: indexing numpy arrays element by element costs more than the rest.
    best = probs.argmax(axis=1).tolist()
    best_scores = probs.max(axis=1).tolist()
    num_tokens = result.num_tokens.tolist()
    truncated = result.truncated.tolist()
    cached = None if result.cached is None else result.cached.tolist()
    windows = None if result.windows is None else result.windows.tolist()
    top_k = min(call.top_k, len(labels))
    order = np.argsort(-probs, axis=1, kind="stable")[:, :top_k].tolist() if top_k else None
    rows = probs.tolist() if order is not None or call.all_scores else None
    # Built in place (results.add, timing fields): constructor arguments would be copied.
    response = pb.ClassifyResponse(id=call.id, model=handle.name, model_version=handle.version)
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
        if windows is not None:
            text.windows = windows[i]
        if passing is not None:
            text.labels_over_threshold.extend(
                label for label, on in zip(labels, passing[i], strict=True) if on
            )
        if rows is not None:
            if order is not None:
                text.top.extend(pb.LabelScore(label=labels[j], score=rows[i][j]) for j in order[i])
            if call.all_scores:
                text.scores.extend(rows[i])
    if call.all_scores:
        response.labels.extend(labels)
    timing(response.timing, result.timings)
    return response


def timing(message: pb.Timing, timings: Timings) -> None:
    """Fill a textserve.v1 Timing message in place from a result's timings."""
    message.queue_seconds = timings.queue_seconds
    message.tokenize_seconds = timings.tokenize_seconds
    message.inference_seconds = timings.inference_seconds
    message.total_seconds = timings.total_seconds
