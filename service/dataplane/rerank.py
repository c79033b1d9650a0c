"""Rerank, transport-neutral: a query and its documents scored by a cross-encoder, best first.

    call = RerankCall("what is deep learning?", ["Deep learning is ...", "Paris is ..."])
    body = await rerank(ctx, call, encode, method="HttpRerank", deadline=d, context=c)

A rerank is a classify of the sentence pairs (query, document): the same prologue, batches,
cache and metrics as every other text (`classify.classify`), so a document scores the same
whichever route asked. What is rerank's own is which score is the relevance: a cross-encoder
with one output (sentence-transformers' CrossEncoder, TEI's rerankers) is scored by that
output; one with two labels by its second (the "relevant" class of a binary fine-tune). The
codecs (TEI /rerank, Cohere/Jina /v1/rerank and /v2/rerank) encode the `Ranking`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np

from textserve.service.dataplane.classify import Classification, ClassifyCall, classify, timing
from textserve.service.dataplane.windows import in_force
from textserve.service.engine.inference import Cut, logits_of
from textserve.service.engine.window_options import OFF, Windows
from textserve.service.errors import ValidationError
from textserve.v1 import classifier_pb2 as pb

if TYPE_CHECKING:
    from textserve.service.dataplane.context import ServingContext
    from textserve.service.engine.handle import ModelHandle, Timings

T = TypeVar("T")


class RerankCall(NamedTuple):
    query: str
    documents: Sequence[str]
    model: str = ""  # "": the default model
    version: int | str | None = None
    truncate: bool | None = None  # None: the default (cut to the model's length)
    top_n: int = 0  # the n most relevant documents; 0: all of them
    raw_scores: bool = False  # the model's score before its activation (a logit)
    return_documents: bool = False  # the answer carries each ranked document's text
    id: str = ""  # echoed in the answer
    windows: Windows | None = None  # long documents by windows (windows.py), not cut
    cut: Cut | None = None  # the request's own truncation (Cohere's max_tokens_per_doc, TEI's)


class Ranking(NamedTuple):
    call: RerankCall
    handle: ModelHandle
    order: list[int]  # document indexes, most relevant first, top_n of them
    scores: list[float]  # per document (input order)
    num_tokens: list[int]  # per document: tokens of its (query, document) pair
    timings: Timings
    windows: list[int] | None  # per document: its windows, when split


def relevance_column(handle: ModelHandle) -> int:
    """Which of the model's scores is a document's relevance; ValidationError for a model that
    is no cross-encoder (one score, or two labels)."""
    labels = len(handle.labels)
    if labels == 1:
        return 0
    if labels == 2:
        return 1
    raise ValidationError(
        f"model {handle.name!r} has {labels} labels: rerank needs a cross-encoder with one "
        "score (one label) or a binary classifier (two labels, the second one relevant)"
    )


async def rerank(
    ctx: ServingContext,
    call: RerankCall,
    encode: Callable[[Ranking], T],
    *,
    method: str,
    deadline: float | None,
    context: Any = None,
) -> T:
    """Score each (query, document) pair and return `encode(ranking)`; observed as `method`.
    Raises the taxonomy of service/errors.py, as classify does."""
    if not call.documents:
        raise ValidationError("rerank needs at least one document")
    windows = call.windows
    if windows is None:  # the model's default stride, a document scored by its best window
        default = in_force(ctx, None, call.model)
        windows = None if default is None else Windows("max", default.stride)
    pairs = ClassifyCall(
        [call.query] * len(call.documents),
        call.documents,
        model=call.model,
        version=call.version,
        truncate=call.truncate,
        windows=windows or OFF,
        cut=call.cut,
    )
    return await classify(
        ctx,
        pairs,
        lambda answer: encode(ranking(call, answer)),
        method=method,
        deadline=deadline,
        context=context,
        admit=relevance_column,  # a model that is no cross-encoder runs nothing
    )


def ranking(call: RerankCall, answer: Classification) -> Ranking:
    handle = answer.handle
    index = relevance_column(handle)
    column = answer.result.probabilities[:, index]
    scores = column
    if call.raw_scores:  # the graph's logit; derived from the score when not run (windows)
        logits = answer.result.logits
        # a relevance column is a sigmoid's, or a two-label softmax's: the sigmoid of the two
        # logits' difference, which the same inverse gives ('none': the score itself)
        inverse = "none" if handle.manifest.activation == "none" else "sigmoid"
        scores = logits_of(column, inverse) if logits is None else logits[:, index]
    order = np.argsort(-column, kind="stable")
    if call.top_n:
        order = order[: call.top_n]
    return Ranking(
        call,
        handle,
        order.tolist(),
        scores.astype(np.float64).tolist(),
        answer.result.num_tokens.tolist(),
        answer.result.timings,
        None if answer.result.windows is None else answer.result.windows.tolist(),
    )


def v1_rerank_response(ranking: Ranking) -> pb.RerankResponse:
    """The textserve.v1 RerankResponse of a ranking (what the gRPC Rerank sends)."""
    call, handle = ranking.call, ranking.handle
    response = pb.RerankResponse(id=call.id, model=handle.name, model_version=handle.version)
    add = response.results.add
    for i in ranking.order:
        ranked = add(index=i, score=ranking.scores[i], num_tokens=ranking.num_tokens[i])
        if call.return_documents:
            ranked.document = call.documents[i]
        if ranking.windows is not None:
            ranked.windows = ranking.windows[i]
    timing(response.timing, ranking.timings)
    return response
