"""Export a training run to a new version of the model repository: models/<name>/<N>/.

    >>> export_run("runs/20250101-120000-small", "models", "default")  # doctest: +SKIP
    PosixPath('models/default/1')

Order: load the run, export, check, optimize, check again, derive int8/fp16 if asked, then
publish atomically (export/publish.py) — only after every check passed, so a crash, a full
disk or a failed check never leaves a partial version behind.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import torch

from textserve.artifact import MODEL_FILE, TOKENIZER_FILE, Manifest, sha256_file
from textserve.export import transforms, validate
from textserve.export.errors import ExportError
from textserve.export.options import ExportOptions
from textserve.export.publish import check_name, publish, staged_version
from textserve.model.checkpoint import Run

logger = logging.getLogger(__name__)

# fp16 against the fp32 PyTorch model: float16 keeps ~3 significant digits, so logits of a few
# units differ by up to ~1e-2; 5e-2 + 1e-2·|logit| leaves room without hiding a broken graph.
FP16_ATOL = 5e-2
FP16_RTOL = 1e-2


@dataclass
class _Built:
    """The graph to publish and what the checks found (goes into the manifest)."""

    graph: Path
    precision: str
    opset: int
    parity: dict[str, float]
    test_accuracy: float
    extra: dict[str, Any] = field(default_factory=dict)


def export_run(
    run_dir: str | Path,
    repository: str | Path,
    name: str,
    options: ExportOptions | None = None,
    **changes: Any,
) -> Path:
    """Export, check and publish the run as the next version of `name`; returns its directory.

    `options` says how (ExportOptions' defaults when None); `changes` replace some of its fields
    (`export_run(run, repo, "m", threads=1)`), validated as ExportOptions validates. Raises
    ExportError for bad input (run directory, repository, options) and its subclass CheckFailed
    when the model fails a check; in both cases nothing is published. int8 and fp16 graphs are
    derived from the checked fp32 graph.
    """
    opts = dataclasses.replace(options or ExportOptions(), **changes)
    check_name(name)
    run = _load_run(run_dir, opts.threads)
    model_dir = Path(repository) / name
    with staged_version(model_dir) as tmp:
        work = tmp / ".work"
        work.mkdir()
        built = _build(run, work, opts)
        os.replace(built.graph, tmp / MODEL_FILE)
        shutil.copyfile(run.tokenizer_path, tmp / TOKENIZER_FILE)
        shutil.rmtree(work)
        manifest = Manifest(
            name=name,
            version=1,  # publish() sets the version it gets
            labels=list(run.labels),
            max_length=run.max_length,
            pad_token_id=run.pad_token_id,
            opset=built.opset,
            precision=built.precision,
            sha256={f: sha256_file(tmp / f) for f in (MODEL_FILE, TOKENIZER_FILE)},
            source_checkpoint_sha256=sha256_file(run.weights_path),
            parity=built.parity,
            test_accuracy=built.test_accuracy,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            extra=built.extra,
        )
        version_dir = publish(tmp, model_dir, manifest)
    logger.info("published %s (%s)", version_dir, built.precision)
    return version_dir


def _load_run(run_dir: str | Path, threads: int | None) -> Run:
    from textserve.model.checkpoint import CheckpointError, load_run

    if threads:
        torch.set_num_threads(threads)
    try:
        return load_run(run_dir)
    except CheckpointError as exc:
        raise ExportError(str(exc)) from None


def _build(run: Run, work: Path, opts: ExportOptions) -> _Built:
    """Export, check, optimize, check again, then derive the int8/fp16 graph if asked."""
    inputs = validate.parity_inputs(
        run.max_length, run.config.vocab_size, pad_token_id=run.pad_token_id
    )
    batches = validate.tokenized_batches(
        run.tokenizer, run.test_texts, max_length=run.max_length, pad_token_id=run.pad_token_id
    )
    extra: dict[str, Any] = {
        "exporter": f"torch.onnx.export ({opts.exporter})",
        "graph_form": "padding-free" if opts.padding_free else "dense",
        "versions": {
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": ort.__version__,
        },
        "run_dir": str(run.run_dir),
        "test_split_size": len(run.test_texts),
        "parity_shapes": [f"{ids.shape[0]}x{ids.shape[1]}" for ids, _ in inputs],
    }

    raw = work / "raw.onnx"
    logger.info(
        "exporting to ONNX (%s exporter, opset %d, %s graph)",
        opts.exporter,
        opts.opset,
        extra["graph_form"],
    )
    transforms.export_onnx(
        run.model,
        raw,
        max_length=run.max_length,
        pad_token_id=run.pad_token_id,
        opset=opts.opset,
        exporter=opts.exporter,
        padding_free=opts.padding_free,
    )
    opset_used, max_diff = _check_fp32(
        raw, run, inputs, atol=opts.atol, rtol=opts.rtol, threads=opts.threads, label="fp32"
    )
    graph = raw
    if opts.optimize:
        graph = work / "optimized.onnx"
        logger.info("optimizing offline (onnxruntime, %s level)", transforms.OFFLINE_LEVEL)
        transforms.optimize_offline(raw, graph)
        extra["optimization"] = {
            "onnxruntime_offline_level": transforms.OFFLINE_LEVEL,
            "max_abs_logit_diff_before": max_diff,
        }
        opset_used, max_diff = _check_fp32(
            graph,
            run,
            inputs,
            atol=opts.atol,
            rtol=opts.rtol,
            threads=opts.threads,
            label="fp32 optimized",
        )
    else:
        extra["optimization"] = None
    logger.info("checking the whole test split (%d texts)", len(run.test_texts))
    split = validate.compare_on_texts(
        graph, run.model, batches, run.test_labels, threads=opts.threads
    )
    validate.check_agreement(split, minimum=1.0, label="fp32")
    extra["reference_test_accuracy"] = split.reference_accuracy
    parity = {
        "max_abs_logit_diff": max_diff,
        "argmax_agreement": split.argmax_agreement,
        "tolerance": opts.atol,
        "rtol": opts.rtol,
        "test_split_max_abs_logit_diff": split.max_abs_logit_diff,
    }
    built = _Built(graph, "fp32", opset_used, parity, split.accuracy, extra)
    if opts.quantize == "int8":
        return _build_int8(built, run, work, inputs, batches, opts.max_accuracy_drop, opts.threads)
    if opts.fp16:
        return _build_fp16(built, run, work, inputs, batches, opts.max_accuracy_drop, opts.threads)
    return built


def _check_fp32(
    path: Path,
    run: Run,
    inputs: list[validate.Batch],
    *,
    atol: float,
    rtol: float,
    threads: int | None,
    label: str,
) -> tuple[int, float]:
    """(opset, max |Δlogit|) of a graph that passed check_model and the fp32 parity check."""
    logger.info(
        "checking %s: onnx.checker, graph contract, parity at %d shapes", label, len(inputs)
    )
    opset = validate.check_model(path, num_labels=len(run.labels))
    report = validate.assert_parity(
        path, run.model, inputs, rtol=rtol, atol=atol, label=label, threads=threads
    )
    return opset, report.max_abs_logit_diff


def _build_int8(
    fp32: _Built,
    run: Run,
    work: Path,
    inputs: list[validate.Batch],
    batches: list[validate.Batch],
    max_accuracy_drop: float,
    threads: int | None,
) -> _Built:
    path = work / "int8.onnx"
    logger.info("quantizing to int8 (dynamic)")
    settings = transforms.quantize_int8(fp32.graph, path)
    opset = validate.check_model(path, num_labels=len(run.labels))
    split = validate.compare_on_texts(path, run.model, batches, run.test_labels, threads=threads)
    drop = validate.check_accuracy_drop(
        fp32.test_accuracy, split.accuracy, max_drop_points=max_accuracy_drop, label="int8"
    )
    # No logit tolerance for int8: quantization moves logits by design; accuracy is the check.
    parity = _loose_parity(path, run, inputs, threads)
    extra = dict(fp32.extra)
    extra["quantization"] = {
        **settings,
        "fp32_test_accuracy": fp32.test_accuracy,
        "int8_test_accuracy": split.accuracy,
        "accuracy_delta_points": _points(-drop),
        "max_accuracy_drop_points": max_accuracy_drop,
        "fp32_parity": fp32.parity,
    }
    parity.update(
        argmax_agreement=split.argmax_agreement,
        test_split_max_abs_logit_diff=split.max_abs_logit_diff,
    )
    return _Built(path, "int8", opset, parity, split.accuracy, extra)


def _build_fp16(
    fp32: _Built,
    run: Run,
    work: Path,
    inputs: list[validate.Batch],
    batches: list[validate.Batch],
    max_accuracy_drop: float,
    threads: int | None,
) -> _Built:
    path = work / "fp16.onnx"
    logger.info("converting to fp16")
    settings = transforms.convert_fp16(fp32.graph, path)
    opset = validate.check_model(path, num_labels=len(run.labels))
    # fp16 is meant for CUDA; check it there when onnxruntime has it, else on the CPU provider
    # (which runs float16 graphs too, so the graph is never published unchecked).
    provider = (
        "CUDAExecutionProvider"
        if "CUDAExecutionProvider" in ort.get_available_providers()
        else "CPUExecutionProvider"
    )
    report = validate.assert_parity(
        path,
        run.model,
        inputs,
        rtol=FP16_RTOL,
        atol=FP16_ATOL,
        label="fp16",
        threads=threads,
        providers=[provider],
    )
    split = validate.compare_on_texts(
        path, run.model, batches, run.test_labels, threads=threads, providers=[provider]
    )
    drop = validate.check_accuracy_drop(
        fp32.test_accuracy, split.accuracy, max_drop_points=max_accuracy_drop, label="fp16"
    )
    extra = dict(fp32.extra)
    extra["fp16"] = {
        **settings,
        "checked_on": provider,
        "atol": FP16_ATOL,
        "rtol": FP16_RTOL,
        "fp32_test_accuracy": fp32.test_accuracy,
        "accuracy_delta_points": _points(-drop),
        "max_accuracy_drop_points": max_accuracy_drop,
        "fp32_parity": fp32.parity,
    }
    parity = {
        "max_abs_logit_diff": report.max_abs_logit_diff,
        "argmax_agreement": split.argmax_agreement,
        "tolerance": FP16_ATOL,
        "rtol": FP16_RTOL,
        "test_split_max_abs_logit_diff": split.max_abs_logit_diff,
    }
    return _Built(path, "fp16", opset, parity, split.accuracy, extra)


def _points(value: float) -> float:
    return round(value, 4) + 0.0  # + 0.0 turns -0.0 into 0.0


def _loose_parity(
    path: Path, run: Run, inputs: list[validate.Batch], threads: int | None
) -> dict[str, float]:
    """max |Δlogit| against PyTorch with no bound (for graphs whose check is accuracy).

    An infinite tolerance still fails on NaN or infinite logits.
    """
    report = validate.assert_parity(
        path, run.model, inputs, rtol=0.0, atol=float("inf"), label="int8", threads=threads
    )
    return {"max_abs_logit_diff": report.max_abs_logit_diff}
