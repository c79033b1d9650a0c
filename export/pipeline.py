"""The one export pipeline: any source's model, checked, as the next version of a model.

    >>> export_run("runs/20250101-120000-small", "models", "default")  # doctest: +SKIP
    PosixPath('models/default/1')
    >>> export_source(PathSource(Path("my-bert")), "models", "my-bert", opts)  # doctest: +SKIP

Every source (a training run, a Hugging Face folder, a --module factory: export/sources.py)
yields one `Description`, and every description takes the same road: vet its labels and
tokenizer (export/vetting.py), write the graph (the
source's exporter: TorchScript or dynamo, dynamic batch and sequence axes), check it
(onnx.checker, the graph contract, parity with PyTorch at several shapes; for a Hugging Face
folder also tokenization parity with its AutoTokenizer and served-score parity with its
pipeline; a token classifier's: per-token logits on real tokens, character offsets, and its
token-classification pipeline's every token), optimize (kept only through the optimizer's
gate: export/gates.py), score the test split where there is one (100% argmax agreement with
PyTorch; the manifest's test_accuracy), derive int8 or fp16 if asked (through their accuracy
gates), then publish atomically (export/publish.py) — only after every check passed, so a
crash, a full disk or a failed check never leaves a partial version behind.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import torch

from textserve.artifact import MODEL_FILE, TOKENIZER_FILE, Manifest, Source, sha256_file
from textserve.export import checks, gates, token_checks, transforms, vetting
from textserve.export.checks import Encoder, Feed
from textserve.export.description import Description
from textserve.export.gates import Built, Job
from textserve.export.options import ExportOptions
from textserve.export.publish import check_name, publish, staged_version
from textserve.export.sources import ExportSource, RunSource

logger = logging.getLogger(__name__)


def export_source(
    source: ExportSource,
    repository: str | Path,
    name: str,
    options: ExportOptions | None = None,
    **changes: Any,
) -> Path:
    """Describe, export, check and publish the source's model as the next version of `name`;
    returns its directory.

    `options` says how (ExportOptions' defaults when None); `changes` replace some of its fields
    (`export_source(src, repo, "m", threads=1)`), validated as ExportOptions validates. Raises
    ExportError for bad input (the name, the source, the repository, options) and its subclass
    CheckFailed when the model fails a check; in both cases nothing is published.
    """
    opts = dataclasses.replace(options or ExportOptions(), **changes)
    check_name(name)  # before the source is looked at: a bad name is the cheaper mistake
    description = source.describe(opts)
    vetting.check_labels(description.labels, description.labels_origin)
    vetting.check_vocabulary(description.tokenizer_file, description.vocab_size)
    model_dir = Path(repository) / name
    with staged_version(model_dir) as tmp:
        work = tmp / ".work"
        work.mkdir()
        built = build(description, work, opts)
        os.replace(built.graph, tmp / MODEL_FILE)
        shutil.copyfile(description.tokenizer_file, tmp / TOKENIZER_FILE)
        shutil.rmtree(work)
        version_dir = publish(tmp, model_dir, manifest(description, built, name, tmp))
    logger.info("published %s (%s)", version_dir, built.precision)
    return version_dir


def export_run(
    run_dir: str | Path,
    repository: str | Path,
    name: str,
    options: ExportOptions | None = None,
    **changes: Any,
) -> Path:
    """export_source of a training run (`textserve train`'s folder)."""
    return export_source(RunSource(Path(run_dir)), repository, name, options, **changes)


def manifest(description: Description, built: Built, name: str, folder: Path) -> Manifest:
    """The manifest of the version staged in `folder` (its files already there)."""
    return Manifest(
        name=name,
        version=1,  # publish() sets the version it gets
        labels=list(description.labels),
        max_length=description.max_length,
        pad_token_id=description.pad_token_id,
        opset=built.opset,
        precision=built.precision,
        sha256={f: sha256_file(folder / f) for f in (MODEL_FILE, TOKENIZER_FILE)},
        source_checkpoint_sha256=sha256_file(description.checkpoint),
        parity=built.parity,
        test_accuracy=built.test_accuracy,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        extra=built.extra,
        source=Source(**description.source),
        inputs=list(description.inputs),
        activation=description.activation,
        threshold=0.5 if description.activation == "sigmoid" else None,
        unk_token_id=description.unk_token_id,
        truncation_side=description.truncation_side,
        task=description.task,
        tagging=description.tagging,
        zero_shot=description.zero_shot,
    )


def build(description: Description, work: Path, options: ExportOptions) -> Built:
    """The checked fp32 graph, or the int8 / fp16 one derived from it, in `work`."""
    d = description
    feeds = checks.parity_feeds(
        d.max_length, d.vocab_size, pad_token_id=d.pad_token_id, inputs=d.inputs,
        type_vocab_size=d.type_vocab_size,
    )  # fmt: skip
    job = Job(d, options, work, Encoder.of(d), feeds)
    fp32 = build_fp32(job)
    if options.quantize == "int8":
        return gates.int8(fp32, job)
    if options.fp16:
        return gates.fp16(fp32, job)
    return fp32


def build_fp32(job: Job) -> Built:
    """Export, check, optimize (through its gate), score the test split."""
    d, options, raw = job.description, job.options, job.work / "raw.onnx"
    extra = _extra(d, transforms.write_graph(d, raw, options), job.feeds)
    graph = gates.checked(raw, job, "fp32")
    parity: dict[str, float] = {"tolerance": options.atol, "rtol": options.rtol}
    reference = Transformers.of(d, job.encoder, options.threads)
    if reference is not None:
        parity.update(reference.check(raw))
    extra["optimization"] = None
    if options.optimize:
        graph, extra["optimization"] = gates.optimized(graph, job)
        if reference is not None and graph.path != raw:
            parity.update(reference.served(graph.path))
    parity["max_abs_logit_diff"] = graph.max_abs_logit_diff
    if d.split is None or not d.split.texts:
        return Built(graph.path, "fp32", graph.opset, parity, None, extra)
    split = gates.split_report(graph.path, job)
    checks.check_agreement(split, minimum=1.0, label="fp32")
    extra["reference_test_accuracy"] = split.reference_accuracy
    parity.update(
        argmax_agreement=split.argmax_agreement,
        test_split_max_abs_logit_diff=split.max_abs_logit_diff,
    )
    return Built(graph.path, "fp32", graph.opset, parity, split.accuracy, extra)


def _extra(description: Description, written: dict[str, str], feeds: list[Feed]) -> dict[str, Any]:
    """The manifest's extra as the export starts: how the graph was written, with what."""
    split = description.split
    return {
        **written,
        "versions": {
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": ort.__version__,
            **description.versions,
        },
        **description.notes,
        "test_split_size": len(split.texts) if split else 0,
        "parity_shapes": [f"{f['input_ids'].shape[0]}x{f['input_ids'].shape[1]}" for f in feeds],
    }


@dataclass(frozen=True)
class Transformers:
    """The checks against transformers' own tokenizer and pipeline: a Hugging Face folder's."""

    description: Description
    encoder: Encoder
    reference: Any  # transformers' tokenizer of the folder
    pairs: tuple[tuple[str, ...], ...] | None  # (first texts, second texts)
    threads: int | None

    @classmethod
    def of(
        cls, description: Description, encoder: Encoder, threads: int | None
    ) -> Transformers | None:
        """None where there is no folder to compare with (a run, a --module)."""
        if description.folder is None:
            return None
        reference = checks.reference_tokenizer(description)
        # a token classifier tags one text at a time (its pipeline takes no pairs)
        takes_pairs = encoder.takes_pairs and not description.per_token
        pairs = tuple(zip(*checks.CHECK_PAIRS, strict=True)) if takes_pairs else None
        if pairs is not None and not checks.reference_types_pairs(description, reference):
            logger.warning(
                "sentence pairs not checked: transformers' tokenizer of %s returns no "
                "token_type_ids (its model_input_names), so its pipeline feeds a pair as one "
                "segment, while textserve feeds the pair template's type ids",
                description.folder,
            )
            pairs = None
        return cls(description, encoder, reference, pairs, threads)

    def check(self, graph: Path) -> dict[str, float]:
        """Tokenization and served-score parity (of pairs too, with a pair template; of
        character offsets too, for a token classifier)."""
        d, ours, reference = self.description, self.encoder, self.reference
        if d.per_token:
            texts = checks.TOKEN_CHECK_TEXTS
            return {
                "tokenization_texts": checks.tokenization_parity(d, ours, reference, texts),
                "tokenization_offsets": token_checks.offsets_parity(d, ours, reference, texts),
                **self.served(graph),
            }
        figures: dict[str, float] = {
            "tokenization_texts": checks.tokenization_parity(d, ours, reference)
        }
        figures.update(self.served(graph, pairs=False))
        if self.pairs is not None:  # a pair template: sentence pairs are checked the same way
            figures["tokenization_pairs"] = checks.tokenization_parity(
                d, ours, reference, *self.pairs
            )
            figures.update(self.served(graph, texts=False))
        return figures

    def served(self, graph: Path, *, texts: bool = True, pairs: bool = True) -> dict[str, float]:
        """Served-score parity of the graph, on the check texts and (with a template) pairs."""
        d, ours, reference, threads = self.description, self.encoder, self.reference, self.threads
        figures = {}
        if texts and d.per_token:
            figures["served_max_abs_score_diff"] = token_checks.served_token_parity(
                graph, d, ours, reference, threads=threads
            )
        elif texts:
            figures["served_max_abs_score_diff"] = checks.served_parity(
                graph, d, ours, reference, threads=threads
            )
        if pairs and self.pairs is not None:
            figures["served_pairs_max_abs_score_diff"] = checks.served_parity(
                graph, d, ours, reference, *self.pairs, threads=threads
            )
        return figures
