"""Zero-shot classification, transport-neutral: texts scored against labels chosen per request
by a natural-language-inference (NLI) model, as transformers' zero-shot pipeline scores them.

    call = ZeroShotCall(["the match went to penalties"], ["sport", "politics"])
    body = await zero_shot(ctx, call, encode, method="ZeroShot", deadline=d, context=c)

Each (text, candidate label) becomes the sentence pair (text, hypothesis_template with the
label in it), classified like any pair: the same batches, queue bound and metrics. From the
NLI model's logits, at the entailment and (multi-label) contradiction label indexes its export
recorded in the manifest's `zero_shot` (textserve.nli; a version exported before they were
recorded has its labels searched by the same rule instead):
single-label, a softmax over the candidates of their entailment logits (the scores sum to 1);
multi-label, each candidate on its own, a softmax over its (contradiction, entailment) logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np

from textserve.artifact import shown
from textserve.nli import AmbiguousLabels, nli_labels
from textserve.service.dataplane.classify import Classification, ClassifyCall, classify, timing
from textserve.service.errors import ValidationError
from textserve.v1 import classifier_pb2 as pb

if TYPE_CHECKING:
    from textserve.service.dataplane.context import ServingContext
    from textserve.service.engine.handle import ModelHandle, Timings

T = TypeVar("T")
DEFAULT_TEMPLATE = "This example is {}."  # transformers' pipeline default
MAX_LABELS = 256


class ZeroShotCall(NamedTuple):
    texts: Sequence[str]
    candidate_labels: Sequence[str]
    hypothesis_template: str = DEFAULT_TEMPLATE
    multi_label: bool = False
    model: str = ""
    version: int | str | None = None
    truncate: bool | None = None
    id: str = ""


class ZeroShot(NamedTuple):
    call: ZeroShotCall
    handle: ModelHandle
    order: list[list[int]]  # per text: candidate indexes, best first
    scores: list[list[float]]  # per text: each candidate's score (candidate order)
    timings: Timings


def hypotheses(call: ZeroShotCall) -> list[str]:
    """Each candidate label in the template; ValidationError for a call that cannot run."""
    labels, template = call.candidate_labels, call.hypothesis_template or DEFAULT_TEMPLATE
    if not labels:
        raise ValidationError("candidate_labels: give at least one label")
    if len(labels) > MAX_LABELS:
        raise ValidationError(f"candidate_labels: at most {MAX_LABELS}, got {len(labels)}")
    if template.count("{}") != 1 or "{" in template.replace("{}", "", 1):
        raise ValidationError(
            f"hypothesis_template must hold the label's place once as {{}}, got {template[:80]!r}"
        )
    if any(not label.strip() for label in labels):
        raise ValidationError("candidate_labels: a label is empty")
    return [template.replace("{}", label) for label in labels]


def nli_columns(handle: ModelHandle, multi_label: bool) -> tuple[int, int]:
    """(entailment, contradiction) label indexes of an NLI model, as its manifest's `zero_shot`
    records them (contradiction -1: none). A manifest without one (a version exported before
    the export recorded them) has its labels searched by the export's rule (textserve.nli).
    ValidationError for a model that is no NLI model, or has no contradiction label for
    multi_label."""
    recorded = handle.manifest.zero_shot
    if recorded is None:  # exported before the export recorded it: zero-shot as served then
        try:
            recorded = nli_labels(handle.labels)
        except AmbiguousLabels:
            recorded = None
    columns = recorded or {}
    entail, contra = columns.get("entailment"), columns.get("contradiction")
    if entail is None:
        raise ValidationError(
            f"model {shown(handle.name)} was not exported as an NLI model: no entailment label "
            f"in its manifest (labels {_some(handle.labels)}); zero-shot needs an NLI model"
        )
    if multi_label and contra is None:
        raise ValidationError(
            f"model {shown(handle.name)} has no contradiction label in its manifest (labels "
            f"{_some(handle.labels)}): multi_label needs one; send multi_label false"
        )
    return entail, -1 if contra is None else contra


def _some(labels: Sequence[str], most: int = 8) -> str:
    """The first labels of a model, for a message (a model may have thousands)."""
    listed = ", ".join(shown(label, limit=40) for label in labels[:most])
    return listed if len(labels) <= most else f"{listed}, … ({len(labels)} in all)"


async def zero_shot(
    ctx: ServingContext,
    call: ZeroShotCall,
    encode: Callable[[ZeroShot], T],
    *,
    method: str,
    deadline: float | None,
    context: Any = None,
) -> T:
    """Score every (text, candidate) pair and return `encode(zero_shot)`; observed as
    `method`. Raises the taxonomy of service/errors.py, as classify does."""
    claims = hypotheses(call)
    n = len(claims)
    if not call.texts:
        raise ValidationError("no texts: send at least one text")
    pairs = ClassifyCall(
        [text for text in call.texts for _ in range(n)],
        [claim for _ in call.texts for claim in claims],
        model=call.model,
        version=call.version,
        truncate=call.truncate,
    )
    return await classify(
        ctx,
        pairs,
        lambda answer: encode(scored(call, answer, n)),
        method=method,
        deadline=deadline,
        context=context,
        admit=lambda handle: nli_columns(handle, call.multi_label),  # before any pair runs
    )


def scored(call: ZeroShotCall, answer: Classification, n: int) -> ZeroShot:
    handle, result = answer.handle, answer.result
    entail, contra = nli_columns(handle, call.multi_label)
    logits = result.logits
    if logits is None:  # pairs always run (never cached): a batch that did not is a bug
        raise RuntimeError("zero-shot pairs were answered without logits")
    logits = logits.astype(np.float64).reshape(len(call.texts), n, -1)
    if call.multi_label:
        two = logits[..., [contra, entail]]
        two = np.exp(two - two.max(axis=-1, keepdims=True))
        scores = two[..., 1] / two.sum(axis=-1)
    else:
        entailment = logits[..., entail]
        e = np.exp(entailment - entailment.max(axis=1, keepdims=True))
        scores = e / e.sum(axis=1, keepdims=True)
    order = np.argsort(-scores, axis=1, kind="stable")
    return ZeroShot(call, handle, order.tolist(), scores.tolist(), result.timings)


def v1_zero_shot_response(answer: ZeroShot) -> pb.ZeroShotResponse:
    """The textserve.v1 ZeroShotResponse (what the gRPC ZeroShot sends, HTTP its JSON)."""
    call, handle = answer.call, answer.handle
    response = pb.ZeroShotResponse(id=call.id, model=handle.name, model_version=handle.version)
    labels = call.candidate_labels
    for order, scores in zip(answer.order, answer.scores, strict=True):
        response.results.add().labels.extend(
            pb.LabelScore(label=labels[i], score=scores[i]) for i in order
        )
    timing(response.timing, answer.timings)
    return response
