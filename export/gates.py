"""Graphs derived from the checked fp32 graph, each published only through its gate, whatever
the source:

- the optimizer's (transforms.optimize: onnxruntime's transformer optimizer for the model types
  it knows, its offline level for the others): kept only if it passes the fp32 checks and runs
  at least MIN_SPEEDUP faster, timed here, on the machine that exports;
- int8 (dynamic quantization): no logit bound (finite logits at the parity shapes), its test
  accuracy (without a test split: its agreement with the fp32 graph's labels on the check
  texts) at most --max-accuracy-drop points below fp32's;
- fp16: parity within FP16_ATOL + FP16_RTOL·|logit| on CUDA where onnxruntime has it (else the
  CPU provider), and the same accuracy rule as int8.

    job = Job(description, options, work, Encoder.of(description), feeds)
    graph, note = optimized(checked(raw, job, "fp32"), job)
    built = int8(fp32, job)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from textserve.export import checks, transforms
from textserve.export.checks import Encoder, Feed
from textserve.export.description import Description
from textserve.export.errors import CheckFailed
from textserve.export.options import ExportOptions

logger = logging.getLogger(__name__)

# A rewritten graph is kept only when it is at least this much faster than the one it replaces
# (below that, the timing is within this shared machine's noise and the plain graph is simpler).
MIN_SPEEDUP = 1.05
TIMING_SHAPE = (8, 64)  # batch × tokens the candidates are timed at (capped by max_length)
# fp16 against the fp32 PyTorch model: float16 keeps ~3 significant digits, so logits of a few
# units differ by up to ~1e-2; 5e-2 + 1e-2·|logit| leaves room without hiding a broken graph.
FP16_ATOL = 5e-2
FP16_RTOL = 1e-2


@dataclass(frozen=True)
class Job:
    """One export's working set: what is exported, how, where, and what it is checked with."""

    description: Description
    options: ExportOptions
    work: Path  # scratch folder for the candidate graphs
    encoder: Encoder  # texts -> the graph's inputs, as the server encodes them
    feeds: list[Feed]  # the parity checks' random batches


@dataclass(frozen=True)
class Graph:
    """A graph that passed the fp32 checks."""

    path: Path
    opset: int
    max_abs_logit_diff: float  # against PyTorch at the parity shapes


@dataclass
class Built:
    """The graph to publish and what the checks found (goes into the manifest)."""

    graph: Path
    precision: str
    opset: int
    parity: dict[str, float]
    test_accuracy: float | None  # None: no test split
    extra: dict[str, Any] = field(default_factory=dict)


def checked(path: Path, job: Job, label: str) -> Graph:
    """The graph, once it passed onnx.checker, the graph contract and fp32 parity."""
    logger.info(
        "checking %s: onnx.checker, graph contract, parity at %d shapes", label, len(job.feeds)
    )
    opset = _contract(path, job)
    report = checks.assert_parity(
        path,
        job.description.model,
        job.feeds,
        rtol=job.options.rtol,
        atol=job.options.atol,
        label=label,
        threads=job.options.threads,
    )
    return Graph(path, opset, report.max_abs_logit_diff)


def optimized(fp32: Graph, job: Job) -> tuple[Graph, dict[str, Any]]:
    """The optimizer's graph if it passes the fp32 checks and runs faster, else `fp32`; and
    the manifest's extra.optimization."""
    d, path = job.description, job.work / "optimized.onnx"
    how = transforms.optimize(fp32.path, path, d.ort_model_type, d.shape)
    note: dict[str, Any] = {"method": how, "max_abs_logit_diff_before": fp32.max_abs_logit_diff}
    if d.ort_model_type is None:
        note["onnxruntime_offline_level"] = transforms.OFFLINE_LEVEL
    try:
        candidate = checked(path, job, f"fp32 optimized ({how})")
    except CheckFailed as exc:
        logger.warning("the optimized graph is not kept: %s", exc)
        return fp32, {**note, "kept": False, "why": str(exc)}
    speedup = measured_speedup(fp32.path, path, job)
    kept = speedup >= MIN_SPEEDUP
    logger.info(
        "optimized graph (%s): %.2fx the exporter's, %s", how, speedup, "kept" if kept else "not"
    )
    b, t = _timing_shape(d)
    note.update(kept=kept, speedup=round(speedup, 3), timed_at=f"{b}x{t}")
    return (candidate if kept else fp32), note


def int8(fp32: Built, job: Job) -> Built:
    """Dynamic int8 of the fp32 graph, through int8's gate (see the module docstring)."""
    logger.info("quantizing to int8 (dynamic)")
    path, settings, opset = _derived(fp32, job, "int8", transforms.quantize_int8)
    # No logit tolerance for int8: quantization moves logits by design; accuracy is the check.
    # An infinite tolerance still fails on NaN or infinite logits.
    loose = checks.assert_parity(
        path, job.description.model, job.feeds, rtol=0.0, atol=float("inf"), label="int8",
        threads=job.options.threads,
    )  # fmt: skip
    held = accuracy_held(fp32, path, job, "int8")
    speedup = measured_speedup(fp32.graph, path, job)
    if speedup < 1.0:
        logger.warning("int8 measured %.2fx fp32's speed here", speedup)
    note = {
        **settings,
        **held.note,
        "checked_on": held.checked_on,
        "speedup_vs_fp32": round(speedup, 3),
        "max_abs_logit_diff": loose.max_abs_logit_diff,
    }
    if held.accuracy is not None:
        note["int8_test_accuracy"] = held.accuracy
    parity = {k: v for k, v in fp32.parity.items() if k not in ("tolerance", "rtol")}
    parity.update(max_abs_logit_diff=loose.max_abs_logit_diff, **held.parity)
    return Built(path, "int8", opset, parity, held.accuracy, {**fp32.extra, "quantization": note})


def fp16(fp32: Built, job: Job) -> Built:
    """The fp16 graph of the fp32 one, through fp16's gate (see the module docstring)."""
    logger.info("converting to fp16")
    path, settings, opset = _derived(fp32, job, "fp16", transforms.convert_fp16)
    # fp16 is meant for CUDA; check it there when onnxruntime has it, else on the CPU provider
    # (which runs float16 graphs too, so the graph is never published unchecked).
    provider = (
        "CUDAExecutionProvider"
        if "CUDAExecutionProvider" in ort.get_available_providers()
        else "CPUExecutionProvider"
    )
    report = checks.assert_parity(
        path, job.description.model, job.feeds, rtol=FP16_RTOL, atol=FP16_ATOL, label="fp16",
        threads=job.options.threads, providers=[provider],
    )  # fmt: skip
    held = accuracy_held(fp32, path, job, "fp16", [provider])
    note = {**settings, **held.note, "checked_on": provider, "atol": FP16_ATOL, "rtol": FP16_RTOL}
    parity = {**fp32.parity, "tolerance": FP16_ATOL, "rtol": FP16_RTOL, **held.parity}
    parity["max_abs_logit_diff"] = report.max_abs_logit_diff
    return Built(path, "fp16", opset, parity, held.accuracy, {**fp32.extra, "fp16": note})


def _derived(
    fp32: Built, job: Job, precision: str, transform: Callable[[Path, Path], dict[str, object]]
) -> tuple[Path, dict[str, object], int]:
    """`transform` of the fp32 graph (its settings), past onnx.checker and the graph contract."""
    path = job.work / f"{precision}.onnx"
    settings = transform(fp32.graph, path)
    return path, settings, _contract(path, job)


def _contract(path: Path, job: Job) -> int:
    """check_model with the description's labels and inputs; the graph's opset."""
    d = job.description
    return checks.check_model(
        path, num_labels=len(d.labels), inputs=d.inputs, per_token=d.per_token
    )


@dataclass(frozen=True)
class Held:
    """What the accuracy gate of an int8 or fp16 graph found."""

    accuracy: float | None  # the candidate's test accuracy; None: no test split
    note: dict[str, Any]  # for the manifest's extra.quantization / extra.fp16
    parity: dict[str, float]  # the candidate's test-split figures, for the manifest's parity
    checked_on: str  # where the accuracy was measured


def accuracy_held(
    fp32: Built, path: Path, job: Job, label: str, providers: Sequence[str] | None = None
) -> Held:
    """CheckFailed unless the candidate's accuracy is at most --max-accuracy-drop points below
    fp32's: on the test split, or (without one) its agreement with fp32's labels on the check
    texts."""
    agreement = _agreement(fp32.graph, path, job, providers)
    limit, split = job.options.max_accuracy_drop, job.description.split
    note: dict[str, Any] = {
        "fp32_argmax_agreement": agreement,
        "max_accuracy_drop_points": limit,
        "fp32_parity": fp32.parity,
    }
    if split is None or fp32.test_accuracy is None:
        drop = checks.check_accuracy_drop(1.0, agreement, max_drop_points=limit, label=label)
        return Held(None, {**note, "accuracy_delta_points": _points(-drop)}, {}, "the check texts")
    report = split_report(path, job, providers)
    drop = checks.check_accuracy_drop(
        fp32.test_accuracy, report.accuracy, max_drop_points=limit, label=label
    )
    note.update(fp32_test_accuracy=fp32.test_accuracy, accuracy_delta_points=_points(-drop))
    parity = {
        "argmax_agreement": report.argmax_agreement,
        "test_split_max_abs_logit_diff": report.max_abs_logit_diff,
    }
    return Held(report.accuracy, note, parity, split.origin)


def split_report(
    path: Path, job: Job, providers: Sequence[str] | None = None
) -> checks.SplitReport:
    """The graph against PyTorch on the description's test split, encoded as served."""
    d = job.description
    assert d.split is not None
    logger.info("checking the whole test split (%d texts)", len(d.split.texts))
    return checks.compare_on_texts(
        path,
        d.model,
        job.encoder.batches(d.split.texts),
        d.split.labels,
        threads=job.options.threads,
        providers=providers,
    )


def measured_speedup(before: Path, after: Path, job: Job) -> float:
    """How many times faster `after` runs than `before` (median of a batch at TIMING_SHAPE)."""
    return _seconds(before, job) / _seconds(after, job)


def _seconds(path: Path, job: Job, repeats: int = 5) -> float:
    """Median seconds of one batch at TIMING_SHAPE, after a warm-up run."""
    d = job.description
    b, t = _timing_shape(d)
    (feed,) = checks.parity_feeds(
        d.max_length, d.vocab_size, pad_token_id=d.pad_token_id, inputs=d.inputs,
        type_vocab_size=d.type_vocab_size, batch_sizes=(b,), lengths=(t,), seed=1,
    )  # fmt: skip
    session = checks.make_session(path, threads=job.options.threads)
    checks.onnx_logits(session, feed)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        checks.onnx_logits(session, feed)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _timing_shape(description: Description) -> tuple[int, int]:
    return TIMING_SHAPE[0], min(TIMING_SHAPE[1], description.max_length)


def _agreement(fp32: Path, candidate: Path, job: Job, providers: Sequence[str] | None) -> float:
    """The fraction of the check texts (a token classifier's: of their real tokens) the
    candidate labels as the fp32 graph does."""
    feed = job.encoder(job.encoder.scorable(checks.CHECK_TEXTS))
    threads = job.options.threads
    want = checks.onnx_logits(checks.make_session(fp32, threads=threads), feed)
    session = checks.make_session(candidate, threads=threads, providers=providers)
    got = checks.onnx_logits(session, feed)
    want, got = checks.label_rows(want, feed), checks.label_rows(got, feed)
    return float((want.argmax(1) == got.argmax(1)).mean())


def _points(value: float) -> float:
    return round(value, 4) + 0.0  # + 0.0 turns -0.0 into 0.0
