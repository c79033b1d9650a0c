"""A token classifier's export checks (export/checks.py's twins for logits per token): each
served token's character offsets against transformers' tokenizer's, and each served token's
label and score against transformers' token-classification pipeline (aggregation none, no
label left out: every token compared; the grouping itself is textserve.tagging's, checked
against the pipeline's in tests/integration/test_token_classification.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from textserve.export.checks import (
    SERVED_ATOL,
    TOKEN_CHECK_TEXTS,
    Encoder,
    _shown,
    apply_activation,
    make_session,
    onnx_logits,
)
from textserve.export.description import Description
from textserve.export.errors import CheckFailed
from textserve.tagging import STRATEGIES, Entity, Tagger, TagOptions, Window
from textserve.tokenization import load_tokenizer


class Tokens(NamedTuple):
    """One text's served tokens as a token classifier reports them."""

    ids: list[int]
    offsets: list[tuple[int, int]]  # characters of the original text, per token
    special: list[int]  # 1: a special token (the template's), never reported


def served_tokens(description: Description, ours: Encoder, texts: Sequence[str]) -> list[Tokens]:
    """The tokens of each text as served (cut to max_length), with the character offsets of the
    version's tokenizer.json; CheckFailed where the tokenizers library's own truncation keeps
    other tokens than the served tokenization (the offsets would then be another text's)."""
    tokenizer = load_tokenizer(description.tokenizer_file)
    tokenizer.no_padding()
    tokenizer.enable_truncation(description.max_length, direction=description.truncation_side)
    found = [
        Tokens(e.ids, [(start, end) for start, end in e.offsets], e.special_tokens_mask)
        for e in tokenizer.encode_batch(list(texts))
    ]
    for row, (tokens, ids) in enumerate(zip(found, ours.tokenization.encode(texts), strict=True)):
        if tokens.ids != ids:
            shown = _shown(texts[row])
            raise CheckFailed(
                "offsets parity",
                f"text {row} ({shown}): the offsets' tokens are not the served ones",
            )
    return found


def offsets_parity(
    description: Description,
    ours: Encoder,
    reference: Any,
    texts: Sequence[str] = TOKEN_CHECK_TEXTS,
) -> int:
    """CheckFailed unless each served token's character offsets (and which tokens are special)
    equal transformers' AutoTokenizer(return_offsets_mapping=True)'s; returns the texts compared."""
    texts = ours.scorable(texts)
    want = reference(
        list(texts),
        truncation=True,
        max_length=description.max_length,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
    )
    got = served_tokens(description, ours, texts)
    for row, tokens in enumerate(got):
        theirs = [tuple(int(i) for i in o) for o in want["offset_mapping"][row]]
        if tokens.offsets != theirs or list(tokens.special) != list(
            want["special_tokens_mask"][row]
        ):
            at = next(
                (i for i, (a, b) in enumerate(zip(tokens.offsets, theirs, strict=False)) if a != b),
                min(len(tokens.offsets), len(theirs)),
            )
            raise CheckFailed(
                "offsets parity",
                f"text {row} ({_shown(texts[row])}): token {at}'s character offsets (or special "
                "tokens) differ from transformers' AutoTokenizer's: "
                f"{tokens.offsets[at : at + 1]} vs {theirs[at : at + 1]}",
            )
    return len(texts)


def served_token_parity(
    graph: Path,
    description: Description,
    ours: Encoder,
    reference: Any,
    texts: Sequence[str] = TOKEN_CHECK_TEXTS,
    *,
    threads: int | None = None,
) -> float:
    """max |Δscore| of each served token's score (textserve tokenization, onnxruntime, softmax
    per token) against transformers.pipeline("token-classification", aggregation_strategy=
    "none", ignore_labels=[]): the same tokens reported (no special token, none missing), each
    with the same label, score within SERVED_ATOL, and the same character offsets;
    CheckFailed otherwise."""
    texts = ours.scorable(texts)
    tokens = served_tokens(description, ours, texts)
    expected = _pipeline_tokens(description, reference, texts)
    logits = onnx_logits(make_session(graph, threads=threads), ours(texts))
    scores = apply_activation(np.asarray(logits, dtype=np.float64), "softmax")
    worst = 0.0
    for row, (want, mine) in enumerate(zip(expected, tokens, strict=True)):
        problem, diff = _token_difference(want, mine, scores[row], description.labels)
        worst = max(worst, diff)
        if problem is not None:
            raise CheckFailed(
                "served token parity",
                f"text {row} ({_shown(texts[row])}): {problem} transformers' pipeline",
                figure=diff,
                limit=SERVED_ATOL,
            )
    return max(worst, entity_parity(description, ours, reference, texts, tokens, scores))


def entity_parity(
    description: Description,
    ours: Encoder,
    reference: Any,
    texts: Sequence[str],
    tokens: Sequence[Tokens],
    scores: np.ndarray,
) -> float:
    """max |Δscore| of the served entities (textserve.tagging over the served tokens' scores)
    against the pipeline's, for every grouping aggregation; CheckFailed when a text's entities
    differ in label, word, offsets or score (over SERVED_ATOL). A text with a near-tie on one
    of its tokens is left out (two runtimes may break it either way, and the grouping with it)."""
    from transformers import pipeline

    tagger = Tagger(
        load_tokenizer(description.tokenizer_file),
        description.labels,
        ours.tokenization.unk_token_id,
    )
    rows = [scores[row, : len(mine.ids)].astype(np.float32) for row, mine in enumerate(tokens)]
    clear = [row for row, probs in enumerate(rows) if not _near_tie(probs, tokens[row])]
    worst = 0.0
    for strategy in STRATEGIES[1:]:
        pipe = pipeline(
            "token-classification", model=description.hf_model, tokenizer=reference,
            aggregation_strategy=strategy, device="cpu",
        )  # fmt: skip
        expected: Any = pipe([texts[row] for row in clear]) if clear else []
        for row, want in zip(clear, expected, strict=True):
            mine = tokens[row]
            window = Window(
                np.asarray(mine.ids), np.asarray(mine.offsets).reshape(-1, 2),
                np.asarray(mine.special, np.bool_),
            )  # fmt: skip
            got = tagger.entities(texts[row], [window], [rows[row]], TagOptions(strategy))
            problem, diff = _entity_difference(list(want), got)
            worst = max(worst, diff)
            if problem is not None:
                raise CheckFailed(
                    "served entity parity",
                    f"text {row} ({_shown(texts[row])}), aggregation {strategy}: {problem}",
                    figure=diff,
                    limit=SERVED_ATOL,
                )
    return worst


def _near_tie(probs: np.ndarray, tokens: Tokens) -> bool:
    reported = probs[~np.asarray(tokens.special, np.bool_)]
    if reported.shape[-1] < 2 or not len(reported):
        return False
    top = np.sort(reported, axis=-1)
    return bool((top[:, -1] - top[:, -2] <= SERVED_ATOL).any())


def _entity_difference(want: list[dict[str, Any]], got: list[Entity]) -> tuple[str | None, float]:
    if len(want) != len(got):
        return f"{len(got)} entities here, {len(want)} in transformers' pipeline", 0.0
    worst = 0.0
    for theirs, mine in zip(want, got, strict=True):
        diff = abs(float(theirs["score"]) - mine.score)
        worst = max(worst, diff)
        fields = (theirs["entity_group"], theirs["word"], theirs["start"], theirs["end"])
        if fields != (mine.label, mine.word, mine.start, mine.end) or diff > SERVED_ATOL:
            return f"{mine} here, {theirs} in transformers' pipeline", diff
    return None, worst


def _token_difference(
    want: list[dict[str, Any]], mine: Tokens, scores: np.ndarray, labels: Sequence[str]
) -> tuple[str | None, float]:
    """What differs between the pipeline's tokens of a text and ours (None: nothing), and the
    largest score difference."""
    reported = [i for i, special in enumerate(mine.special) if not special]
    theirs = [int(t["index"]) for t in want]
    if theirs != reported:
        return f"tokens {reported[:8]} reported here, {theirs[:8]} in", 0.0
    worst = 0.0
    for token in want:
        i = int(token["index"])
        label, score = labels[int(scores[i].argmax())], float(scores[i].max())
        diff = abs(score - float(token["score"]))
        worst = max(worst, diff)
        # a near-tie may go either way between two runtimes: the label is not compared then
        runner_up = float(np.sort(scores[i])[-2]) if len(scores[i]) > 1 else -1.0
        same = label == token["entity"] or score - runner_up <= SERVED_ATOL
        if not (diff <= SERVED_ATOL and same):
            theirs_now = f"{token['entity']} {float(token['score']):.6f}"
            return f"token {i} is {label} {score:.6f} here, {theirs_now} in", diff
        span = (int(token["start"]), int(token["end"]))
        if span != mine.offsets[i]:
            return f"token {i} spans characters {mine.offsets[i]} here, {span} in", worst
    return None, worst


def _pipeline_tokens(
    description: Description, reference: Any, texts: Sequence[str]
) -> list[list[dict[str, Any]]]:
    """transformers' token-classification pipeline's every token (no grouping, no label left
    out) of each text, cut where the server cuts."""
    from transformers import pipeline

    reference.model_max_length = description.max_length  # where the pipeline cuts
    pipe = pipeline(
        "token-classification",
        model=description.hf_model,
        tokenizer=reference,
        aggregation_strategy="none",
        ignore_labels=[],
        device="cpu",
    )
    answers: Any = pipe(list(texts))
    return [list(row) for row in answers]
