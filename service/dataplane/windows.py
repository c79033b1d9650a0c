"""Long texts classified by windows instead of cut: split, classify every window in the same
batches as any text, aggregate per text.

    call = ClassifyCall([long_text], windows=Windows("mean", stride=32))
    result = await classify_windows(handle, call, deadline=d, trace=t)   # one row per text

A text (or, for a pair, its second text: the document of a (query, document) pair) longer than
the model takes is split at token boundaries, each window as long as the model takes beside its
special tokens (and the pair's first text), `stride` tokens shared by neighbours, a window never
starting or ending inside a word. Each window is the original's characters from the end of the
token before it (so a byte-level BPE keeps the space it reads a word by), and is classified as
a text of its own: the tokenizer's special tokens and pair template are its, each window counts
in the token budget, the queue bound, the cache and the batch metrics like any text, and a
window answered alone scores what it scores here. The windows' scores become the text's by
`aggregate`: "mean" (the mean of the logits, as far as the activation lets them be known: the
same softmax as the mean of the logits), "max" (per label the highest score) or "first".
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from textserve.service.engine.inference import logits_of
from textserve.service.engine.window_options import OFF, Windows
from textserve.service.errors import LimitExceededError, ValidationError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from textserve.service.dataplane.context import ServingContext
    from textserve.service.engine.batches import BatchTrace
    from textserve.service.engine.handle import ClassifyResult, ModelHandle

MIN_WINDOW = 8  # tokens a window must have room for beside the special tokens and the pair


def in_force(ctx: ServingContext, asked: Windows | None, model: str) -> Windows | None:
    """The windows a request runs with: its own, else its model's serving.json default (None
    or OFF: long texts are cut). `model`: the resolved name ("": the default model)."""
    if asked is None:
        record = ctx.repository.models.get(model or ctx.repository.default_model or "")
        asked = None if record is None else record.windows
    return None if asked is OFF else asked


def split(
    tokenizer: Tokenizer, max_length: int, text: str, first: str | None, stride: int
) -> list[str]:
    """`text`'s windows (itself when it fits); `first`: the pair's first text, kept whole."""
    fixed = 0 if first is None else len(tokenizer.encode(first, add_special_tokens=False).ids)
    budget = max_length - tokenizer.num_special_tokens_to_add(first is not None) - fixed
    encoding = tokenizer.encode(text, add_special_tokens=False)
    total = len(encoding.ids)
    if total <= budget:
        return [text]
    if budget < MIN_WINDOW or stride >= budget // 2:
        raise ValidationError(
            f"a window has room for {max(budget, 0)} tokens here (the model takes {max_length}, "
            f"less special tokens and the pair's first text): windows need at least "
            f"{MIN_WINDOW}, and a stride under half of them (got {stride})"
        )
    words, offsets = encoding.word_ids, encoding.offsets

    def inside_word(i: int) -> bool:
        return 0 < i < total and words[i] is not None and words[i] == words[i - 1]

    pieces, start = [], 0
    while True:
        end = min(start + budget, total)
        aligned = end
        while aligned > start + 1 and inside_word(aligned):
            aligned -= 1
        end = aligned
        begin = 0 if start == 0 else offsets[start - 1][1]
        finish = len(text) if end == total else offsets[end - 1][1]
        pieces.append(text[begin:finish])
        if end == total:
            return pieces
        start = max(end - stride, start + 1)
        while start < end and inside_word(start):
            start += 1


async def classify_windows(
    handle: ModelHandle,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    windows: Windows,
    *,
    deadline: float | None,
    trace: BatchTrace | None,
) -> ClassifyResult:
    """Classify each text (pair) by windows; the result has one row per text, and
    `windows` says how many each took."""
    handle.validate(texts, pairs)  # before any splitting (pairs: one per text)
    tokenizer = handle.runner.tokenization.tokenizer
    longs = texts if pairs is None else pairs
    firsts: Sequence[str | None] = [None] * len(texts) if pairs is None else texts

    def all_pieces() -> list[list[str]]:
        return [
            split(tokenizer, handle.max_length, one, first, windows.stride)
            for one, first in zip(longs, firsts, strict=True)
        ]

    with handle.held():  # the version waits for this request while its texts are split
        pieces = await asyncio.to_thread(all_pieces)  # a long text takes ms to tokenize
        return await _classify_pieces(handle, texts, pairs, pieces, windows, deadline, trace)


async def _classify_pieces(
    handle: ModelHandle,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    pieces: list[list[str]],
    windows: Windows,
    deadline: float | None,
    trace: BatchTrace | None,
) -> ClassifyResult:
    """The windows of each text (`pieces`) classified in one request, then aggregated."""
    counts = [len(p) for p in pieces]
    limit = handle.max_texts_per_request
    if sum(counts) > limit:
        raise LimitExceededError(
            f"the texts make {sum(counts)} windows; at most {limit} per request "
            "(--max-texts-per-request): send fewer or shorter texts",
            "windows_per_request",
        )
    flat = [piece for p in pieces for piece in p]
    if pairs is None:
        result = await handle.classify(flat, truncate=True, deadline=deadline, trace=trace)
    else:
        repeated = [text for text, count in zip(texts, counts, strict=True) for _ in range(count)]
        result = await handle.classify(
            repeated, pairs=flat, truncate=True, deadline=deadline, trace=trace
        )
    return aggregated(result, counts, windows.aggregate, handle.manifest.activation)


def aggregated(
    result: ClassifyResult, counts: list[int], aggregate: str, activation: str
) -> ClassifyResult:
    """Per text, its windows' rows made one (`counts`: windows per text, in order)."""
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.intp)
    probs = result.probabilities
    if aggregate == "first":
        rows = probs[starts]
    elif aggregate == "max":
        rows = np.maximum.reduceat(probs, starts, axis=0)
    else:
        rows = _mean_of_logits(probs, starts, np.asarray(counts), activation)
    cached = None if result.cached is None else np.logical_and.reduceat(result.cached, starts)
    return replace(
        result,
        probabilities=rows.astype(np.float32),
        num_tokens=np.add.reduceat(result.num_tokens, starts),
        truncated=np.logical_or.reduceat(result.truncated, starts),
        cached=cached,
        windows=np.asarray(counts, dtype=np.int64),
        logits=None,  # a text's logits are its windows': aggregated as scores above
    )


def _mean_of_logits(
    probs: np.ndarray, starts: np.ndarray, counts: np.ndarray, activation: str
) -> np.ndarray:
    logits = logits_of(probs, activation)  # softmax: less a constant per row, the same softmax
    mean = np.add.reduceat(logits, starts, axis=0) / counts[:, None]
    if activation == "softmax":
        e = np.exp(mean - mean.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if activation == "sigmoid":
        return 1 / (1 + np.exp(-mean))
    return mean
