"""Export a foreign model (a Hugging Face folder, a --module factory) as the next version.

    export_foreign(load_folder(Path("my-bert"), opts), "models", "my-bert", opts)

Order, as for our own runs: export (torch.onnx, TorchScript, dynamic batch and sequence axes,
inputs in forward()'s order), check (onnx.checker, the graph contract, parity with PyTorch at
several shapes; for a Hugging Face folder also tokenization parity with its AutoTokenizer and
served-score parity with its pipeline), optimize (onnxruntime's transformer optimizer for the
model type, kept only if it passes the same checks and measures faster), int8 if asked (kept
if its accuracy holds), score --test-data, publish atomically.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from textserve.artifact import (
    MODEL_FILE,
    OUTPUT_NAME,
    TOKENIZER_FILE,
    Manifest,
    Source,
    sha256_file,
)
from textserve.export import foreign_checks as checks
from textserve.export import transforms, validate
from textserve.export.errors import CheckFailed, ExportError
from textserve.export.options import ExportOptions
from textserve.export.publish import check_name, publish, staged_version
from textserve.export.sources import Foreign
from textserve.tokenization import Tokenization, load_tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Encode:
    """texts (and their pairs) -> the graph's int64 inputs, as the server will encode them."""

    tokenization: Tokenization

    def __call__(
        self, texts: Sequence[str], pairs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        batch = self.tokenization.arrays(list(texts), None if pairs is None else list(pairs))
        return {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "token_type_ids": batch.token_type_ids,
        }

    @property
    def takes_pairs(self) -> bool:
        """Whether the tokenizer's pair template sets two texts apart (the server's rule)."""
        return bool(self.tokenization.takes_pairs)


Split = tuple[list[str], list[int]]  # --test-data: texts and label indices
# A rewritten graph is kept only when it is at least this much faster than the one it replaces
# (below that, the timing is within this shared machine's noise and the plain graph is simpler).
MIN_SPEEDUP = 1.05
TIMING_SHAPE = (8, 64)  # batch × tokens the candidates are timed at (capped by max_length)


@dataclass
class _Graph:
    path: Path
    precision: str
    parity: float  # max |Δlogit| against PyTorch at the parity shapes
    notes: dict[str, Any] = field(default_factory=dict)


def export_foreign(
    foreign: Foreign, repository: str | Path, name: str, opts: ExportOptions
) -> Path:
    """Export, check and publish `foreign` as the next version of `name`; its directory."""
    check_name(name)
    if opts.fp16:
        raise ExportError("--fp16 is for textserve runs; a foreign model exports as fp32 or int8")
    test = _test_split(foreign, opts.test_data)
    model_dir = Path(repository) / name
    with staged_version(model_dir) as tmp:
        work = tmp / ".work"
        work.mkdir()
        encode = _encoder(foreign, opts)
        graph, parity, extra = _build(foreign, work, opts, encode, test)
        accuracy = _accuracy(graph.path, foreign, encode, test, opts.threads)
        os.replace(graph.path, tmp / MODEL_FILE)
        shutil.copyfile(foreign.tokenizer_file, tmp / TOKENIZER_FILE)
        shutil.rmtree(work)
        manifest = Manifest(
            name=name,
            version=1,  # publish() sets the version it gets
            labels=list(foreign.labels),
            max_length=foreign.max_length,
            pad_token_id=foreign.pad_token_id,
            opset=validate.check_model(
                tmp / MODEL_FILE, num_labels=len(foreign.labels), inputs=foreign.inputs
            ),
            precision=graph.precision,
            sha256={f: sha256_file(tmp / f) for f in (MODEL_FILE, TOKENIZER_FILE)},
            source_checkpoint_sha256=sha256_file(foreign.checkpoint),
            parity=parity,
            test_accuracy=accuracy,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            extra={**extra, **graph.notes, "test_split_size": len(test[0]) if test else 0},
            source=Source(**foreign.source),
            inputs=list(foreign.inputs),
            activation=foreign.activation,
            threshold=0.5 if foreign.activation == "sigmoid" else None,
            unk_token_id=foreign.unk_token_id,
            truncation_side=opts.truncation_side,
        )
        version_dir = publish(tmp, model_dir, manifest)
    logger.info("published %s (%s)", version_dir, graph.precision)
    return version_dir


def _encoder(foreign: Foreign, opts: ExportOptions) -> Encode:
    """textserve's tokenization as the server will run it, from the file it will read."""
    return Encode(
        Tokenization(
            load_tokenizer(foreign.tokenizer_file),
            foreign.max_length,
            foreign.pad_token_id,
            unk_token_id=foreign.unk_token_id,
            truncation_side=opts.truncation_side,
        )
    )


def _build(
    foreign: Foreign, work: Path, opts: ExportOptions, encode: Encode, test: Split | None = None
) -> tuple[_Graph, dict[str, float], dict[str, Any]]:
    batches = checks.random_batches(foreign)
    raw = work / "raw.onnx"
    logger.info("exporting %s to ONNX (opset %d)", foreign.source["architecture"], opts.opset)
    export_graph(foreign, raw, opset=opts.opset)
    fp32 = _checked(raw, foreign, batches, opts, "fp32")
    parity: dict[str, float] = {
        "max_abs_logit_diff": fp32.parity,
        "tolerance": opts.atol,
        "rtol": opts.rtol,
    }
    extra: dict[str, Any] = {
        "exporter": "torch.onnx.export (torchscript)",
        "versions": {
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": ort.__version__,
            **foreign.extra,
        },
        "parity_shapes": [f"{f['input_ids'].shape[0]}x{f['input_ids'].shape[1]}" for f in batches],
    }
    # the check pairs as (first texts, second texts): the parity checks' texts and pairs
    pairs = tuple(zip(*checks.CHECK_PAIRS, strict=True)) if encode.takes_pairs else None
    if foreign.folder is not None:
        reference = checks.reference_tokenizer(foreign, opts.truncation_side)
        if pairs is not None and not checks.reference_types_pairs(foreign, reference):
            logger.warning(
                "sentence pairs not checked: transformers' tokenizer of %s returns no "
                "token_type_ids (its model_input_names), so its pipeline feeds a pair as one "
                "segment, while textserve feeds the pair template's type ids",
                foreign.folder,
            )
            pairs = None
        parity["tokenization_texts"] = checks.tokenization_parity(foreign, encode, reference)
        parity["served_max_abs_score_diff"] = checks.served_parity(
            raw, foreign, encode, reference, threads=opts.threads
        )
        if pairs is not None:  # a pair template: sentence pairs are checked the same way
            parity["tokenization_pairs"] = checks.tokenization_parity(
                foreign, encode, reference, *pairs
            )
            parity["served_pairs_max_abs_score_diff"] = checks.served_parity(
                raw, foreign, encode, reference, *pairs, threads=opts.threads
            )
    graph = _optimized(fp32, foreign, batches, opts, work) if opts.optimize else fp32
    if graph is not fp32 and foreign.folder is not None:
        parity["served_max_abs_score_diff"] = checks.served_parity(
            graph.path, foreign, encode, reference, threads=opts.threads
        )
        if pairs is not None:
            parity["served_pairs_max_abs_score_diff"] = checks.served_parity(
                graph.path, foreign, encode, reference, *pairs, threads=opts.threads
            )
    parity["max_abs_logit_diff"] = graph.parity
    if opts.quantize == "int8":
        graph = _int8(graph, foreign, batches, opts, work, encode, test)
    return graph, parity, extra


def export_graph(foreign: Foreign, path: Path, *, opset: int) -> None:
    """torch.onnx.export of the model, its inputs passed positionally in `foreign.inputs`
    order (forward()'s), with dynamic batch_size and sequence_length axes."""
    t = min(16, foreign.max_length)
    ids = torch.randint(0, foreign.vocab_size, (2, t), dtype=torch.int64)
    ids[ids == foreign.pad_token_id] = (foreign.pad_token_id + 1) % foreign.vocab_size
    mask = torch.ones((2, t), dtype=torch.int64)
    mask[1, max(1, t // 2) :] = 0  # padding in the example, so the mask path is traced
    ids[mask == 0] = foreign.pad_token_id
    example = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    axes = {0: "batch_size", 1: "sequence_length"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and deprecation notices; parity is the proof
        torch.onnx.export(
            foreign.model.eval(),
            tuple(example[n] for n in foreign.inputs),
            str(path),
            dynamo=False,
            input_names=list(foreign.inputs),
            output_names=[OUTPUT_NAME],
            dynamic_axes={**dict.fromkeys(foreign.inputs, axes), OUTPUT_NAME: {0: "batch_size"}},
            opset_version=opset,
            do_constant_folding=True,
        )


def _checked(
    path: Path, foreign: Foreign, batches: list[checks.Feed], opts: ExportOptions, label: str
) -> _Graph:
    validate.check_model(path, num_labels=len(foreign.labels), inputs=foreign.inputs)
    report = checks.graph_parity(
        path, foreign, batches, atol=opts.atol, rtol=opts.rtol, label=label, threads=opts.threads
    )
    return _Graph(path, "fp32", report.max_abs_diff)


def _optimized(
    fp32: _Graph, foreign: Foreign, batches: list[checks.Feed], opts: ExportOptions, work: Path
) -> _Graph:
    """onnxruntime's transformer optimizer (model types it knows) or its basic offline level;
    the result is kept only if it passes the fp32 checks and runs faster."""
    path = work / "optimized.onnx"
    how = optimize(fp32.path, path, foreign.ort_model_type, foreign.shape)
    try:
        candidate = _checked(path, foreign, batches, opts, f"fp32 optimized ({how})")
    except CheckFailed as exc:
        logger.warning("the optimized graph is not kept: %s", exc)
        return _with_note(fp32, optimization={"method": how, "kept": False, "why": str(exc)})
    before, after = (_seconds(g, foreign, opts.threads) for g in (fp32.path, path))
    kept = before / after >= MIN_SPEEDUP
    note = {
        "method": how,
        "kept": kept,
        "speedup": round(before / after, 3),
        "timed_at": f"{TIMING_SHAPE[0]}x{min(TIMING_SHAPE[1], foreign.max_length)}",
    }
    logger.info(
        "optimized graph (%s): %.2fx the exporter's, %s",
        how,
        before / after,
        "kept" if kept else "not kept",
    )
    return _with_note(candidate if kept else fp32, optimization=note)


def optimize(src: Path, dst: Path, model_type: str | None, shape: tuple[int, int] = (0, 0)) -> str:
    """Write an optimized copy of `src`; returns which optimizer it was."""
    if model_type is None:
        transforms.optimize_offline(src, dst)
        return f"onnxruntime offline ({transforms.OFFLINE_LEVEL})"
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    fusions = FusionOptions(model_type)
    # SkipLayerNormalization is slow on CPU here: the server's CPU sessions leave that fusion
    # out online too (textserve.artifact.disabled_optimizers): the offline optimizer leaves it
    fusions.enable_skip_layer_norm = False

    # shape (heads, hidden): the config's (0: the optimizer reads them from the graph); opt_level
    # 0: the Python fusions only (the server's session applies onnxruntime's own levels online,
    # for whatever provider it has)
    model = optimize_model(
        str(src),
        model_type=model_type,
        num_heads=shape[0],
        hidden_size=shape[1],
        opt_level=0,
        use_gpu=False,
        optimization_options=fusions,
    )
    model.save_model_to_file(str(dst))
    return f"onnxruntime.transformers.optimizer ({model_type})"


def _int8(
    graph: _Graph,
    foreign: Foreign,
    batches: list[checks.Feed],
    opts: ExportOptions,
    work: Path,
    encode: Encode,
    test: Split | None,
) -> _Graph:
    """Dynamic int8, checked as our own runs' int8 is: no logit bound (finite logits at the
    parity shapes); its accuracy on --test-data (without one: its agreement with the fp32
    graph's labels on the check texts) within --max-accuracy-drop points of fp32's."""
    path = work / "int8.onnx"
    settings = transforms.quantize_int8(graph.path, path)
    validate.check_model(path, num_labels=len(foreign.labels), inputs=foreign.inputs)
    loose = checks.graph_parity(
        path, foreign, batches, atol=float("inf"), label="int8", threads=opts.threads
    )
    texts = list(checks.CHECK_TEXTS)
    feed = encode(texts)
    fp32_logits, int8_logits = (_logits(g, foreign, feed, opts.threads) for g in (graph.path, path))
    agreement = float((fp32_logits.argmax(1) == int8_logits.argmax(1)).mean())
    reference, candidate = 1.0, agreement
    if test is not None:
        reference, candidate = (
            _accuracy(g, foreign, encode, test, opts.threads) or 0.0 for g in (graph.path, path)
        )
    drop = validate.check_accuracy_drop(
        reference, candidate, max_drop_points=opts.max_accuracy_drop, label="int8"
    )
    before, after = (_seconds(g, foreign, opts.threads) for g in (graph.path, path))
    if after > before:
        logger.warning("int8 measured %.2fx fp32's speed here", before / after)
    note = {
        **settings,
        "fp32_argmax_agreement": agreement,
        "checked_on": "--test-data" if test is not None else "the check texts",
        "accuracy_delta_points": round(-drop, 4) + 0.0,
        "speedup_vs_fp32": round(before / after, 3),
        "max_abs_logit_diff": loose.max_abs_diff,
    }
    return _Graph(path, "int8", graph.parity, {**graph.notes, "quantization": note})


def _with_note(graph: _Graph, **notes: Any) -> _Graph:
    return _Graph(graph.path, graph.precision, graph.parity, {**graph.notes, **notes})


def _logits(
    path: Path, foreign: Foreign, feed: dict[str, np.ndarray], threads: int | None
) -> np.ndarray:
    session = validate.make_session(path, threads=threads)
    (logits,) = session.run([OUTPUT_NAME], {n: feed[n] for n in foreign.inputs})
    return np.asarray(logits)


def _seconds(path: Path, foreign: Foreign, threads: int | None, repeats: int = 5) -> float:
    """Median seconds of one batch at TIMING_SHAPE, after a warm-up run."""
    b, t = TIMING_SHAPE[0], min(TIMING_SHAPE[1], foreign.max_length)
    (feed,) = checks.random_batches(foreign, batch_sizes=(b,), lengths=(t,), seed=1)
    session = validate.make_session(path, threads=threads)
    session.run([OUTPUT_NAME], feed)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run([OUTPUT_NAME], feed)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _test_split(foreign: Foreign, path: Path | None) -> Split | None:
    """--test-data's texts and label indices; ExportError for labels the model does not have."""
    if path is None:
        return None
    if foreign.activation == "none":
        raise ExportError("--test-data scores classifiers; a regression model has no accuracy")
    from textserve.model.data import DataError, load_labelled

    try:
        data = load_labelled(path)
    except DataError as exc:
        raise ExportError(str(exc)) from None
    index = {label: i for i, label in enumerate(foreign.labels)}
    unknown = sorted({str(label) for label in data.labels} - set(index))
    if unknown:
        raise ExportError(
            f"{path}: labels {', '.join(map(repr, unknown[:5]))} are not the model's "
            f"({', '.join(foreign.labels[:10])})"
        )
    return list(data.texts), [index[str(label)] for label in data.labels]


def _accuracy(
    graph: Path,
    foreign: Foreign,
    encode: Encode,
    test: Split | None,
    threads: int | None,
) -> float | None:
    """The published graph's accuracy on --test-data as served (None without one)."""
    if test is None:
        return None
    texts, labels = test
    session = validate.make_session(graph, threads=threads)
    hits = 0
    for i in range(0, len(texts), validate.EVAL_BATCH_SIZE):
        feed = encode(texts[i : i + validate.EVAL_BATCH_SIZE])
        (logits,) = session.run([OUTPUT_NAME], {n: feed[n] for n in foreign.inputs})
        hits += int(
            (np.asarray(logits).argmax(1) == labels[i : i + validate.EVAL_BATCH_SIZE]).sum()
        )
    return hits / len(texts) if texts else None
