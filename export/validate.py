"""Checks an exported graph must pass before it is published; the CLI and the tests share them.

    >>> check_model("model.onnx", num_labels=2)  # doctest: +SKIP
    >>> inputs = parity_inputs(max_length=64, vocab_size=8000)
    >>> assert_parity("model.onnx", run.model, inputs, rtol=0, atol=1e-4)  # doctest: +SKIP

Every check raises `CheckFailed` naming the check and the figure that broke it. Inference here
follows the serving path exactly: `textserve.tokenization` (the one tokenization) and an
onnxruntime session made by `textserve.onnx_contract`, as the server's; the graph contract is
its check_graph too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from tokenizers import Tokenizer

from textserve.artifact import INPUT_NAMES, OUTPUT_NAME
from textserve.export.errors import CheckFailed
from textserve.export.options import MIN_OPSET
from textserve.onnx_contract import GraphContractError, check_graph, inference_session
from textserve.tokenization import encode_batch

PARITY_BATCH_SIZES = (1, 7, 64)
PARITY_LENGTHS = (1, 5, 37, None)  # None: the model's max_length
EVAL_BATCH_SIZE = 64

Batch = tuple[np.ndarray, np.ndarray]  # (input_ids, attention_mask), both int64 (B, T)


@dataclass(frozen=True)
class ParityReport:
    max_abs_logit_diff: float  # over every logit of every case
    argmax_agreement: float  # fraction of rows whose argmax matches PyTorch's
    cases: int
    rows: int


@dataclass(frozen=True)
class SplitReport:
    """ONNX against PyTorch on real texts (the run's test split), tokenized as the server does."""

    n: int
    argmax_agreement: float  # fraction of texts with the same predicted label
    accuracy: float  # of the ONNX graph
    reference_accuracy: float  # of the PyTorch model
    max_abs_logit_diff: float


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
) -> int:
    """onnx.checker with full checks plus the graph contract (`inputs`, in order: the manifest
    lists them); returns the default-domain opset."""
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
        check_graph(model, inputs, num_labels=num_labels, strict=True)
    except GraphContractError as exc:
        raise CheckFailed("graph contract", str(exc)) from None
    return int(opset)


def parity_inputs(
    max_length: int,
    vocab_size: int,
    *,
    pad_token_id: int = 0,
    batch_sizes: Sequence[int] = PARITY_BATCH_SIZES,
    lengths: Sequence[int | None] = PARITY_LENGTHS,
    seed: int = 0,
) -> list[Batch]:
    """Random token batches at shapes other than the export shape, with mixed padding.

    In every batch of more than one row, row 0 fills the whole length, row 1 has one real token
    and the rest have random real lengths, so padded and unpadded rows share one batch.
    Lengths above max_length are left out (the server never sends them).
    """
    rng = np.random.default_rng(seed)
    wanted = sorted({min(t or max_length, max_length) for t in lengths})
    batches: list[Batch] = []
    for b in batch_sizes:
        for t in wanted:
            real = rng.integers(1, t + 1, size=b)
            real[0] = t
            if b > 1:
                real[1] = 1
            # Real tokens avoid the pad id, as a tokenizer never emits [PAD] for text.
            ids = rng.integers(1, vocab_size, size=(b, t), dtype=np.int64)
            ids[ids == pad_token_id] = 1 if pad_token_id != 1 else 2
            mask = (np.arange(t)[None, :] < real[:, None]).astype(np.int64)
            ids[mask == 0] = pad_token_id
            batches.append((ids, mask))
    return batches


def torch_logits(
    model: torch.nn.Module, input_ids: np.ndarray, attention_mask: np.ndarray
) -> np.ndarray:
    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model(
            torch.from_numpy(input_ids).to(device), torch.from_numpy(attention_mask).to(device)
        )
    return out.float().cpu().numpy()


def onnx_logits(
    session: ort.InferenceSession, input_ids: np.ndarray, attention_mask: np.ndarray
) -> np.ndarray:
    (logits,) = session.run(
        [OUTPUT_NAME], {INPUT_NAMES[0]: input_ids, INPUT_NAMES[1]: attention_mask}
    )
    return np.asarray(logits)


def assert_parity(
    onnx_path: Path | str,
    model: torch.nn.Module,
    inputs: Sequence[Batch],
    *,
    rtol: float,
    atol: float,
    label: str = "fp32",
    threads: int | None = None,
    providers: Sequence[str] | None = None,
) -> ParityReport:
    """CheckFailed unless |onnx - torch| <= atol + rtol·|torch| for every logit of each batch."""
    session = make_session(onnx_path, threads=threads, providers=providers)
    worst, agree, rows = 0.0, 0, 0
    for input_ids, attention_mask in inputs:
        got = onnx_logits(session, input_ids, attention_mask)
        want = torch_logits(model, input_ids, attention_mask)
        if got.shape != want.shape or got.dtype != np.float32:
            raise CheckFailed(
                f"parity ({label})",
                f"logits are {got.dtype} {got.shape}, PyTorch gives float32 {want.shape}",
            )
        diff = np.abs(got - want)
        worst = max(worst, float(diff.max()))
        agree += int((got.argmax(axis=1) == want.argmax(axis=1)).sum())
        rows += got.shape[0]
        excess = diff - (atol + rtol * np.abs(want))
        if not np.all(np.isfinite(got)) or float(excess.max()) > 0:
            b, t = input_ids.shape
            raise CheckFailed(
                f"parity ({label})",
                f"max |Δlogit| {float(diff.max()):.3g} at batch {b} × {t} tokens exceeds "
                f"atol {atol:g} + rtol {rtol:g}·|logit|",
                figure=float(diff.max()),
                limit=atol,
            )
    return ParityReport(
        max_abs_logit_diff=worst,
        argmax_agreement=agree / rows if rows else 1.0,
        cases=len(inputs),
        rows=rows,
    )


def tokenized_batches(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    *,
    max_length: int,
    pad_token_id: int,
    batch_size: int = EVAL_BATCH_SIZE,
) -> list[Batch]:
    """Consecutive batches of texts, tokenized by the contract's rules (as the server does)."""
    return [
        encode_batch(tokenizer, texts[i : i + batch_size], max_length, pad_token_id)
        for i in range(0, len(texts), batch_size)
    ]


def accuracy(logits: np.ndarray, labels: Sequence[int]) -> float:
    if len(labels) == 0:
        return 0.0
    return float((logits.argmax(axis=1) == np.asarray(labels)).mean())


def compare_on_texts(
    onnx_path: Path | str,
    model: torch.nn.Module,
    batches: Sequence[Batch],
    labels: Sequence[int],
    *,
    threads: int | None = None,
    providers: Sequence[str] | None = None,
) -> SplitReport:
    """ONNX and PyTorch predictions on the same tokenized texts (e.g. the whole test split)."""
    session = make_session(onnx_path, threads=threads, providers=providers)
    got = np.concatenate([onnx_logits(session, ids, mask) for ids, mask in batches])
    want = np.concatenate([torch_logits(model, ids, mask) for ids, mask in batches])
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
