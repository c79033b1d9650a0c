"""The textserve.v1 request messages the clients build (textserve.client's Client and
AsyncClient, textserve.http_client's HttpClient), checked where a client can tell a caller
what is wrong before anything is sent; and `redact`, which masks a Tag answer's entities.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textserve.v1 import classifier_pb2 as pb


def classify_request(
    texts: Sequence[str],
    model: str | None,
    version: int | None,
    truncate: bool | None,
    top_k: int,
    all_scores: bool,
    request_id: str,
    text_pairs: Sequence[str] | None = None,
    threshold: float | None = None,
) -> pb.ClassifyRequest:
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of strings, not one string")
    for index, text in enumerate(texts):
        if isinstance(text, str) and not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:  # gRPC strings are UTF-8: lone surrogates can't go
                raise ValueError(
                    f"texts[{index}] is not valid Unicode text (a lone surrogate at character "
                    f"{exc.start}); decode your input with errors='replace' or fix it"
                ) from None
    request = pb.ClassifyRequest(
        id=request_id,
        texts=list(texts),
        model=model or "",
        version=version or 0,
        top_k=top_k,
        all_scores=all_scores,
    )
    if truncate is not None:
        request.truncate = truncate
    if text_pairs is not None:  # sentence pairs: one second text per text
        if isinstance(text_pairs, str):
            raise TypeError("text_pairs must be a sequence of strings, not one string")
        request.text_pairs.extend(text_pairs)
    if threshold is not None:  # multi-label models: the score a label must reach
        request.threshold = threshold
    return request


def rerank_request(
    query: str,
    documents: Sequence[str],
    model: str | None,
    version: int | None,
    truncate: bool | None,
    top_n: int,
    raw_scores: bool,
    return_documents: bool,
    request_id: str,
) -> pb.RerankRequest:
    if isinstance(documents, str):
        raise TypeError("documents must be a sequence of strings, not one string")
    request = pb.RerankRequest(
        id=request_id,
        query=query,
        documents=list(documents),
        model=model or "",
        version=version or 0,
        top_n=top_n,
        raw_scores=raw_scores,
        return_documents=return_documents,
    )
    if truncate is not None:
        request.truncate = truncate
    return request


def tag_request(
    texts: Sequence[str],
    model: str | None,
    version: int | None,
    aggregation: str,
    ignore_labels: Sequence[str] | None,
    threshold: float,
    windows: bool | None,
    stride: int | None,
    truncate: bool | None,
    request_id: str,
) -> pb.TagRequest:
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of strings, not a string")
    request = pb.TagRequest(
        id=request_id,
        texts=list(texts),
        model=model or "",
        version=version or 0,
        aggregation=aggregation,
        threshold=threshold,
    )
    if ignore_labels is not None:
        request.ignore_labels.labels.extend(ignore_labels)
    for name, value in (("windows", windows), ("stride", stride), ("truncate", truncate)):
        if value is not None:
            setattr(request, name, value)
    return request


def redact(text: str, entities: Sequence[Any], mask: str = "[{label}]") -> str:
    """`text` with each entity's span (start, end: a TagResponse's, or Entity's) replaced by
    `mask` formatted with its label; overlapping spans masked once.

    >>> from textserve.v1 import classifier_pb2 as pb
    >>> redact("Call Ada on Monday", [pb.Entity(label="PER", start=5, end=8)])
    'Call [PER] on Monday'
    """
    out, at = [], 0
    for entity in sorted(entities, key=lambda e: (e.start, -e.end)):
        if entity.end <= at:
            continue
        out.append(text[at : max(entity.start, at)])
        out.append(mask.format(label=entity.label))
        at = entity.end
    out.append(text[at:])
    return "".join(out)


def zero_shot_request(
    texts: Sequence[str],
    candidate_labels: Sequence[str],
    hypothesis_template: str,
    multi_label: bool,
    model: str | None,
    version: int | None,
    truncate: bool | None,
    request_id: str,
) -> pb.ZeroShotRequest:
    if isinstance(texts, str) or isinstance(candidate_labels, str):
        raise TypeError("texts and candidate_labels must be sequences of strings, not strings")
    request = pb.ZeroShotRequest(
        id=request_id,
        texts=list(texts),
        candidate_labels=list(candidate_labels),
        hypothesis_template=hypothesis_template,
        multi_label=multi_label,
        model=model or "",
        version=version or 0,
    )
    if truncate is not None:
        request.truncate = truncate
    return request
