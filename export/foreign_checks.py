"""Checks a foreign model's graph passes before it is published (Hugging Face folders, --module).

    batches = random_batches(foreign)                       # several shapes, padded rows
    graph_parity(graph, foreign, batches, atol=1e-4)        # ONNX vs PyTorch, inputs by name
    tokenization_parity(foreign, tokenization)              # textserve vs transformers
    served_parity(graph, foreign, tokenization)             # our scores vs pipeline's
    # and both again on CHECK_PAIRS when the tokenizer has a pair template

Each raises CheckFailed naming the check and the figure. Graph parity feeds onnxruntime by name
and PyTorch by keyword, so a graph whose inputs were exported in another order than forward()
takes them (mask and type ids swapped) fails here; served parity compares with transformers'
own pipeline, which nothing of ours is in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from textserve.artifact import OUTPUT_NAME
from textserve.export.errors import CheckFailed
from textserve.export.sources import Foreign
from textserve.export.validate import PARITY_BATCH_SIZES, PARITY_LENGTHS, make_session

Feed = dict[str, np.ndarray]  # graph input name -> int64 (B, T)
SERVED_ATOL = 1e-4  # served scores vs transformers' pipeline

# Texts the tokenization and served-score checks use beside any test split: ordinary ones,
# empty and blank ones, unusual Unicode (accents, combining marks, CJK, emoji, zero-width and
# control characters), and ones far over any max_length (several thousand characters).
CHECK_TEXTS = (
    "a gripping, beautifully acted film",
    "",
    "   ",
    "Dull. Dull! DULL?",
    "Ünïcödé naïve café — crème brûlée, e\u0301 vs é",
    "北京欢迎你 東京 서울 🙂🎬👍🏽",
    "zero\u200bwidth\u00a0nbsp\ttab\nnewline \x07bell",
    "the story " * 400,
    "unbroken" * 900,
    "mixed 长 text " * 300 + "🙂" * 50,
)


# Sentence pairs (checked when the tokenizer's pair template sets two texts apart): ordinary
# ones, one side or both far over max_length (longest_first cuts the longer first), unusual
# Unicode. No empty side: the server refuses an empty pair text before tokenizing.
CHECK_PAIRS = (
    ("a man sleeps", "a person rests"),
    ("Dull. Dull! DULL?", "a gripping, beautifully acted film"),
    ("the story " * 400, "short"),
    ("short", "the plot " * 400),
    ("unbroken" * 900, "mixed 长 text " * 300),
    ("Ünïcödé naïve café", "北京欢迎你 🙂🎬👍🏽 zero\u200bwidth"),
)


@dataclass(frozen=True)
class Parity:
    max_abs_diff: float
    cases: int


def random_batches(
    foreign: Foreign,
    *,
    batch_sizes: Sequence[int] = PARITY_BATCH_SIZES,
    lengths: Sequence[int | None] = PARITY_LENGTHS,
    seed: int = 0,
) -> list[Feed]:
    """Random batches at shapes other than the export's, with padded and full rows; type ids
    random where the graph takes them (0 on padding)."""
    rng = np.random.default_rng(seed)
    pad, top = foreign.pad_token_id, foreign.max_length
    batches = []
    for b in batch_sizes:
        for t in sorted({min(x or top, top) for x in lengths}):
            real = rng.integers(1, t + 1, size=b)
            real[0] = t
            if b > 1:
                real[1] = 1
            ids = rng.integers(0, foreign.vocab_size, size=(b, t), dtype=np.int64)
            ids[ids == pad] = (pad + 1) % foreign.vocab_size
            mask = (np.arange(t)[None, :] < real[:, None]).astype(np.int64)
            ids[mask == 0] = pad
            feed = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in foreign.inputs:
                types = rng.integers(0, max(2, foreign.type_vocab_size), size=(b, t))
                feed["token_type_ids"] = (types * mask).astype(np.int64)
            batches.append({n: feed[n] for n in foreign.inputs})
    return batches


def torch_logits(model: torch.nn.Module, feed: Feed) -> np.ndarray:
    with torch.inference_mode():
        out = model(**{k: torch.from_numpy(v) for k, v in feed.items()})
    return np.asarray(out.float().numpy())


def graph_parity(
    graph: Path,
    foreign: Foreign,
    batches: Sequence[Feed],
    *,
    atol: float,
    rtol: float = 0.0,
    label: str = "fp32",
    threads: int | None = None,
) -> Parity:
    """CheckFailed unless |onnx - torch| <= atol + rtol·|torch| for every logit of each batch."""
    session = make_session(graph, threads=threads)
    worst = 0.0
    for feed in batches:
        (got,) = session.run([OUTPUT_NAME], feed)
        want = torch_logits(foreign.model, feed)
        if got.shape != want.shape:
            raise CheckFailed(
                f"parity ({label})", f"logits are {got.shape}, PyTorch's {want.shape}"
            )
        diff = np.abs(got - want)
        worst = max(worst, float(diff.max()))
        if not np.all(np.isfinite(got)) or float((diff - atol - rtol * np.abs(want)).max()) > 0:
            b, t = feed["input_ids"].shape
            raise CheckFailed(
                f"parity ({label})",
                f"max |Δlogit| {float(diff.max()):.3g} at batch {b} × {t} tokens exceeds atol "
                f"{atol:g} (inputs {list(feed)}: are they in forward()'s order?)",
                figure=float(diff.max()),
                limit=atol,
            )
    return Parity(worst, len(batches))


def reference_tokenizer(foreign: Foreign, truncation_side: str) -> Any:
    """transformers' own tokenizer of the folder (the one its pipeline uses)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(foreign.folder, local_files_only=True)
    tokenizer.truncation_side = truncation_side
    return tokenizer


def reference_types_pairs(foreign: Foreign, reference: Any) -> bool:
    """Whether transformers would feed a pair's type ids as textserve does: the graph takes
    none, or the folder's tokenizer returns them (a generic PreTrainedTokenizerFast saved
    without model_input_names returns none, and its pipeline then feeds zeros)."""
    names = getattr(reference, "model_input_names", None) or ()
    return "token_type_ids" not in foreign.inputs or "token_type_ids" in names


def tokenization_parity(
    foreign: Foreign,
    ours: Any,
    reference: Any,
    texts: Sequence[str] = CHECK_TEXTS,
    pairs: Sequence[str] | None = None,
) -> int:
    """CheckFailed unless textserve's ids, masks (and type ids where the graph takes them) equal
    AutoTokenizer(truncation=True, max_length, padding=True)'s, for texts or, with `pairs`,
    sentence pairs; returns the texts compared."""
    want = reference(
        list(texts),
        None if pairs is None else list(pairs),
        truncation=True,
        max_length=foreign.max_length,
        padding=True,
        return_tensors="np",
    )
    got = ours(list(texts), None if pairs is None else list(pairs))
    for name in foreign.inputs:
        a, b = np.asarray(got[name]), np.asarray(want[name]) if name in want else None
        if b is None:
            b = np.zeros_like(a)
        if a.shape != b.shape or not np.array_equal(a, b):
            row = _first_difference(a, b)
            raise CheckFailed(
                "tokenization parity" if pairs is None else "pair tokenization parity",
                f"{name} of text {row} ({_shown(texts[row])}) differs from transformers' "
                f"AutoTokenizer: {a.shape} vs {b.shape}",
            )
    return len(texts)


def served_parity(
    graph: Path,
    foreign: Foreign,
    ours: Any,
    reference: Any,
    texts: Sequence[str] = CHECK_TEXTS,
    pairs: Sequence[str] | None = None,
    *,
    threads: int | None = None,
) -> float:
    """max |Δscore| of our served scores (textserve tokenization, onnxruntime, the manifest's
    activation) against transformers.pipeline("text-classification", top_k=None), of texts
    or, with `pairs`, of sentence pairs ({"text", "text_pair"}); CheckFailed over
    SERVED_ATOL."""
    from transformers import pipeline

    pipe = pipeline(
        "text-classification",
        model=foreign.hf_model,
        tokenizer=reference,
        top_k=None,
        function_to_apply=foreign.activation,
        device="cpu",
    )
    inputs: list[Any] = list(texts)
    if pairs is not None:
        inputs = [{"text": a, "text_pair": b} for a, b in zip(texts, pairs, strict=True)]
    expected: Any = pipe(inputs, truncation=True, max_length=foreign.max_length)
    session = make_session(graph, threads=threads)
    feed = ours(list(texts), None if pairs is None else list(pairs))
    (logits,) = session.run([OUTPUT_NAME], {n: feed[n] for n in foreign.inputs})
    scores = apply_activation(np.asarray(logits, dtype=np.float64), foreign.activation)
    worst = 0.0
    for row, answers in enumerate(expected):
        by_label = {a["label"]: a["score"] for a in answers}
        want = np.array([by_label[label] for label in foreign.labels])
        diff = float(np.abs(scores[row] - want).max())
        worst = max(worst, diff)
        if not diff <= SERVED_ATOL:
            raise CheckFailed(
                "served-score parity" if pairs is None else "served pair-score parity",
                f"text {row} ({_shown(texts[row])}): scores differ from transformers' pipeline "
                f"by {diff:.3g} (> {SERVED_ATOL:g})",
                figure=diff,
                limit=SERVED_ATOL,
            )
    return worst


def apply_activation(logits: np.ndarray, activation: str) -> np.ndarray:
    if activation == "softmax":
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        return np.asarray(shifted / shifted.sum(axis=1, keepdims=True))
    if activation == "sigmoid":
        return np.asarray(1.0 / (1.0 + np.exp(-logits)))
    return logits


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
    for row in range(min(len(a), len(b))):
        if a[row].shape != b[row].shape or not np.array_equal(a[row], b[row]):
            return row
    return 0


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "…")
