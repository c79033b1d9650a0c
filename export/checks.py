"""Every check a graph passes before it is published, whatever its source; the pipeline and the
tests share them.

    >>> check_model("model.onnx", num_labels=2)  # doctest: +SKIP
    >>> feeds = parity_feeds(max_length=64, vocab_size=8000)
    >>> assert_parity("model.onnx", model, feeds, rtol=0, atol=1e-4)  # doctest: +SKIP
    >>> batches = Encoder.of(d).batches(texts)  # d: a source's Description  # doctest: +SKIP
    >>> compare_on_texts("model.onnx", d.model, batches, labels)  # doctest: +SKIP
    >>> reference = reference_tokenizer(d)  # a Hugging Face folder's  # doctest: +SKIP
    >>> tokenization_parity(d, Encoder.of(d), reference)  # doctest: +SKIP
    >>> served_parity("model.onnx", d, Encoder.of(d), reference)  # doctest: +SKIP
    >>> offsets_parity(d, Encoder.of(d), reference)  # a token classifier's  # doctest: +SKIP
    >>> served_token_parity("model.onnx", d, Encoder.of(d), reference)  # doctest: +SKIP

Every check raises `CheckFailed` naming the check and the figure that broke it. Inference here
follows the serving path exactly: `textserve.tokenization` (the one tokenization) and an
onnxruntime session made by `textserve.onnx_contract`, as the server's; the graph contract is
its check_graph too. Graphs are fed by input name and PyTorch by keyword, so a graph whose
inputs were exported in another order than forward() takes them (mask and type ids swapped)
fails graph parity; the transformers checks (a Hugging Face folder's) compare with
transformers' own tokenizer and pipeline, which nothing of ours is in. A token classifier's
logits, (B, T, labels), are compared on real tokens only (what a padding position gives is
never read), and its checks add character offsets and transformers' token-classification
pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from textserve.artifact import INPUT_NAMES, OUTPUT_NAME
from textserve.export.description import Description
from textserve.export.errors import CheckFailed
from textserve.export.options import MIN_OPSET
from textserve.export.tagging import OFFSET_TEXTS
from textserve.onnx_contract import GraphContractError, check_graph, inference_session
from textserve.tokenization import Tokenization, load_tokenizer

PARITY_BATCH_SIZES = (1, 7, 64)
PARITY_LENGTHS = (1, 5, 37, None)  # None: the model's max_length
EVAL_BATCH_SIZE = 64
SERVED_ATOL = 1e-4  # served scores vs transformers' pipeline

Feed = dict[str, np.ndarray]  # graph input name -> int64 (B, T)

# Texts the tokenization and served-score checks (and int8's agreement without a test split)
# use: ordinary ones, empty and blank ones, unusual Unicode (accents, combining marks, CJK,
# emoji, zero-width and control characters), and ones far over any max_length (several
# thousand characters).
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


# A token classifier's check texts: the same, and texts whose entities' character offsets are the
# hard part (accents and combining marks, CJK, emoji, repeated spaces)
TOKEN_CHECK_TEXTS = (*CHECK_TEXTS, *OFFSET_TEXTS)


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
class ParityReport:
    max_abs_logit_diff: float  # over every logit of every case
    argmax_agreement: float  # fraction of rows whose argmax matches PyTorch's
    cases: int
    rows: int


@dataclass(frozen=True)
class SplitReport:
    """ONNX against PyTorch on real texts (a test split), tokenized as the server does."""

    n: int
    argmax_agreement: float  # fraction of texts with the same predicted label
    accuracy: float  # of the ONNX graph
    reference_accuracy: float  # of the PyTorch model
    max_abs_logit_diff: float


@dataclass(frozen=True)
class Encoder:
    """texts (and their pairs) -> the graph's int64 inputs, as the server will encode them."""

    tokenization: Tokenization
    inputs: tuple[str, ...] = INPUT_NAMES

    @classmethod
    def of(cls, description: Description) -> Encoder:
        """The tokenization the manifest will prescribe, from the file the server will read."""
        tokenization = Tokenization(
            load_tokenizer(description.tokenizer_file),
            description.max_length,
            description.pad_token_id,
            unk_token_id=description.unk_token_id,
            truncation_side=description.truncation_side,
        )
        return cls(tokenization, tuple(description.inputs))

    def __call__(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> Feed:
        batch = self.tokenization.arrays(list(texts), None if pairs is None else list(pairs))
        arrays = batch._asdict()
        return {name: arrays[name] for name in self.inputs}

    @property
    def takes_pairs(self) -> bool:
        """Whether the tokenizer's pair template sets two texts apart (the server's rule)."""
        return bool(self.tokenization.takes_pairs)

    def scorable(self, texts: Sequence[str]) -> list[str]:
        """The texts the server scores: all but those with no tokens and no unk token to become
        (a decoder's tokenizer that adds none to an empty text: transformers cannot score it)."""
        rows = self.tokenization.rows(list(texts), type_ids=False)
        return [text for text, row in zip(texts, rows, strict=True) if row.ids]

    def batches(self, texts: Sequence[str], batch_size: int = EVAL_BATCH_SIZE) -> list[Feed]:
        """Consecutive batches of texts, encoded as the server does."""
        return [self(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)]


def make_session(
    onnx_path: Path | str, *, threads: int | None = None, providers: Sequence[str] | None = None
) -> ort.InferenceSession:
    """A session as the server builds it (ORT_ENABLE_ALL), so parity covers its online fusions."""
    session: ort.InferenceSession = inference_session(
        str(onnx_path), list(providers or ["CPUExecutionProvider"]), intra_op_threads=threads
    )
    return session


def check_model(
    onnx_path: Path | str,
    *,
    num_labels: int | None = None,
    inputs: Sequence[str] = INPUT_NAMES,
    per_token: bool = False,
) -> int:
    """onnx.checker with full checks plus the graph contract (`inputs`, in order: the manifest
    lists them; `per_token`: logits per token, a token classifier's); returns the default-domain
    opset."""
    try:
        # The path form (not a loaded proto) also works for models over 2 GB.
        onnx.checker.check_model(str(onnx_path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckFailed("onnx.checker", first) from None
    model = onnx.load(str(onnx_path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise CheckFailed(
            "graph contract", f"opset {opset} < {MIN_OPSET}", figure=opset, limit=MIN_OPSET
        )
    try:
        check_graph(model, inputs, num_labels=num_labels, strict=True, per_token=per_token)
    except GraphContractError as exc:
        raise CheckFailed("graph contract", str(exc)) from None
    return int(opset)


def parity_feeds(
    max_length: int,
    vocab_size: int,
    *,
    pad_token_id: int = 0,
    inputs: Sequence[str] = INPUT_NAMES,
    type_vocab_size: int = 0,
    batch_sizes: Sequence[int] = PARITY_BATCH_SIZES,
    lengths: Sequence[int | None] = PARITY_LENGTHS,
    seed: int = 0,
) -> list[Feed]:
    """Random token batches at shapes other than the export shape, with mixed padding.

    In every batch of more than one row, row 0 fills the whole length, row 1 has one real token
    and the rest have random real lengths, so padded and unpadded rows share one batch. Real
    tokens avoid the pad id, as a tokenizer never emits it for text; type ids are random where
    the graph takes them (0 on padding). Lengths above max_length are left out (the server
    never sends them).
    """
    rng = np.random.default_rng(seed)
    feeds = []
    for b in batch_sizes:
        for t in sorted({min(x or max_length, max_length) for x in lengths}):
            real = rng.integers(1, t + 1, size=b)
            real[0] = t
            if b > 1:
                real[1] = 1
            ids = rng.integers(0, vocab_size, size=(b, t), dtype=np.int64)
            ids[ids == pad_token_id] = (pad_token_id + 1) % vocab_size
            mask = (np.arange(t)[None, :] < real[:, None]).astype(np.int64)
            ids[mask == 0] = pad_token_id
            feed = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in inputs:
                types = rng.integers(0, max(2, type_vocab_size), size=(b, t))
                feed["token_type_ids"] = (types * mask).astype(np.int64)
            feeds.append({name: feed[name] for name in inputs})
    return feeds


def torch_logits(model: torch.nn.Module, feed: Feed) -> np.ndarray:
    """PyTorch's logits, the inputs passed by keyword (on the model's device)."""
    weight = next(model.parameters(), None)
    device = torch.device("cpu") if weight is None else weight.device
    with torch.inference_mode():
        out = model(**{name: torch.from_numpy(v).to(device) for name, v in feed.items()})
    return np.asarray(out.float().cpu().numpy())


def onnx_logits(session: ort.InferenceSession, feed: Feed) -> np.ndarray:
    (logits,) = session.run([OUTPUT_NAME], feed)
    return np.asarray(logits)


def label_rows(logits: np.ndarray, feed: Feed) -> np.ndarray:
    """(rows, labels): a sequence classifier's logits as they are, a token classifier's
    (B, T, labels) at the feed's real tokens only (attention_mask 1)."""
    if logits.ndim == 3:
        return logits[feed["attention_mask"].astype(bool)]
    return logits


def assert_parity(
    onnx_path: Path | str,
    model: torch.nn.Module,
    feeds: Sequence[Feed],
    *,
    rtol: float,
    atol: float,
    label: str = "fp32",
    threads: int | None = None,
    providers: Sequence[str] | None = None,
) -> ParityReport:
    """CheckFailed unless |onnx - torch| <= atol + rtol·|torch| for every logit of each feed
    (of each real token's, per-token logits)."""
    session = make_session(onnx_path, threads=threads, providers=providers)
    worst, agree, rows = 0.0, 0, 0
    for feed in feeds:
        got, want = onnx_logits(session, feed), torch_logits(model, feed)
        if got.shape != want.shape or got.dtype != np.float32:
            raise CheckFailed(
                f"parity ({label})",
                f"logits are {got.dtype} {got.shape}, PyTorch gives float32 {want.shape}",
            )
        got, want = label_rows(got, feed), label_rows(want, feed)
        diff = np.abs(got - want)
        worst = max(worst, float(diff.max()))
        agree += int((got.argmax(axis=1) == want.argmax(axis=1)).sum())
        rows += got.shape[0]
        excess = diff - (atol + rtol * np.abs(want))
        if not np.all(np.isfinite(got)) or float(excess.max()) > 0:
            b, t = feed["input_ids"].shape
            raise CheckFailed(
                f"parity ({label})",
                f"max |Δlogit| {float(diff.max()):.3g} at batch {b} × {t} tokens exceeds "
                f"atol {atol:g} + rtol {rtol:g}·|logit| (inputs {list(feed)}: are they in "
                "forward()'s order?)",
                figure=float(diff.max()),
                limit=atol,
            )
    return ParityReport(worst, agree / rows if rows else 1.0, len(feeds), rows)


def accuracy(logits: np.ndarray, labels: Sequence[int]) -> float:
    if len(labels) == 0:
        return 0.0
    return float((logits.argmax(axis=1) == np.asarray(labels)).mean())


def compare_on_texts(
    onnx_path: Path | str,
    model: torch.nn.Module,
    feeds: Sequence[Feed],
    labels: Sequence[int],
    *,
    threads: int | None = None,
    providers: Sequence[str] | None = None,
) -> SplitReport:
    """ONNX and PyTorch predictions on the same encoded texts (e.g. a whole test split)."""
    session = make_session(onnx_path, threads=threads, providers=providers)
    got = np.concatenate([onnx_logits(session, feed) for feed in feeds])
    want = np.concatenate([torch_logits(model, feed) for feed in feeds])
    return SplitReport(
        n=len(got),
        argmax_agreement=float((got.argmax(axis=1) == want.argmax(axis=1)).mean()),
        accuracy=accuracy(got, labels),
        reference_accuracy=accuracy(want, labels),
        max_abs_logit_diff=float(np.abs(got - want).max()),
    )


def check_agreement(report: SplitReport, *, minimum: float = 1.0, label: str = "fp32") -> None:
    """Raise CheckFailed if fewer than `minimum` of the texts get PyTorch's label."""
    if report.argmax_agreement < minimum:
        differ = round((1.0 - report.argmax_agreement) * report.n)
        raise CheckFailed(
            f"test-split argmax agreement ({label})",
            f"{report.argmax_agreement:.2%} ({differ} of {report.n} texts get another label than "
            f"PyTorch's), needs {minimum:.0%}",
            figure=report.argmax_agreement,
            limit=minimum,
        )


def check_accuracy_drop(
    reference: float, candidate: float, *, max_drop_points: float, label: str
) -> float:
    """The drop in accuracy points (reference - candidate); CheckFailed above `max_drop_points`."""
    drop = (reference - candidate) * 100.0
    if drop > max_drop_points:
        raise CheckFailed(
            f"{label} accuracy",
            f"test accuracy drops {drop:.2f} points (fp32 {reference:.2%} → {label} "
            f"{candidate:.2%}), more than the allowed {max_drop_points:g}",
            figure=drop,
            limit=max_drop_points,
        )
    return drop


def reference_tokenizer(description: Description) -> Any:
    """transformers' own tokenizer of the folder (the one its pipeline uses)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(description.folder, local_files_only=True)
    tokenizer.truncation_side = description.truncation_side
    # padded as the server pads: on the right (Llama's tokenizer pads left), with the manifest's
    # pad id (a decoder's pad may be decided at export, when its tokenizer has none)
    tokenizer.padding_side = "right"
    if tokenizer.pad_token_id != description.pad_token_id:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(description.pad_token_id)
    return tokenizer


def reference_types_pairs(description: Description, reference: Any) -> bool:
    """Whether transformers would feed a pair's type ids as textserve does: the graph takes
    none, or the folder's tokenizer returns them (a generic PreTrainedTokenizerFast saved
    without model_input_names returns none, and its pipeline then feeds zeros)."""
    names = getattr(reference, "model_input_names", None) or ()
    return "token_type_ids" not in description.inputs or "token_type_ids" in names


def tokenization_parity(
    description: Description,
    ours: Encoder,
    reference: Any,
    texts: Sequence[str] = CHECK_TEXTS,
    pairs: Sequence[str] | None = None,
) -> int:
    """CheckFailed unless textserve's ids, masks (and type ids where the graph takes them) equal
    AutoTokenizer(truncation=True, max_length, padding=True)'s, for texts or, with `pairs`,
    sentence pairs; returns the texts compared. A text with no tokens that the server refuses
    (Encoder.scorable) must have none in transformers either, and is not compared further."""
    if pairs is None:
        texts = _scorable(ours, reference, texts)
    want = reference(
        list(texts),
        None if pairs is None else list(pairs),
        truncation=True,
        max_length=description.max_length,
        padding=True,
        return_tensors="np",
    )
    got = ours(texts, pairs)
    for name in description.inputs:
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
    description: Description,
    ours: Encoder,
    reference: Any,
    texts: Sequence[str] = CHECK_TEXTS,
    pairs: Sequence[str] | None = None,
    *,
    threads: int | None = None,
) -> float:
    """max |Δscore| of our served scores (textserve tokenization, onnxruntime, the manifest's
    activation) against transformers.pipeline("text-classification", top_k=None), of texts
    or, with `pairs`, of sentence pairs ({"text", "text_pair"}); CheckFailed over
    SERVED_ATOL. Texts the server refuses (Encoder.scorable) are left out."""
    if pairs is None:
        texts = ours.scorable(texts)
    expected = _pipeline_scores(description, reference, texts, pairs)
    logits = onnx_logits(make_session(graph, threads=threads), ours(texts, pairs))
    scores = apply_activation(np.asarray(logits, dtype=np.float64), description.activation)
    worst = 0.0
    for row, want in enumerate(expected):
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


def _scorable(ours: Encoder, reference: Any, texts: Sequence[str]) -> list[str]:
    """ours.scorable(texts); CheckFailed for a text refused for having no tokens that
    transformers' tokenizer gives tokens."""
    kept = ours.scorable(texts)
    for row, text in enumerate(texts):
        theirs = len(reference(text)["input_ids"]) if text not in kept else 0
        if theirs:
            raise CheckFailed(
                "tokenization parity",
                f"text {row} ({_shown(text)}) has no tokens for textserve, {theirs} for "
                "transformers' AutoTokenizer",
            )
    return kept


def _pipeline_scores(
    description: Description, reference: Any, texts: Sequence[str], pairs: Sequence[str] | None
) -> list[np.ndarray]:
    """transformers' pipeline's scores of each text (or pair), in the description's label order."""
    from transformers import pipeline

    pipe = pipeline(
        "text-classification",
        model=description.hf_model,
        tokenizer=reference,
        top_k=None,
        function_to_apply=description.activation,
        device="cpu",
    )
    inputs: list[Any] = list(texts)
    if pairs is not None:
        inputs = [{"text": a, "text_pair": b} for a, b in zip(texts, pairs, strict=True)]
    answers: Any = pipe(inputs, truncation=True, max_length=description.max_length)
    by_label = [{a["label"]: a["score"] for a in row} for row in answers]
    return [np.array([row[label] for label in description.labels]) for row in by_label]


def apply_activation(logits: np.ndarray, activation: str) -> np.ndarray:
    if activation == "softmax":
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return np.asarray(shifted / shifted.sum(axis=-1, keepdims=True))
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
