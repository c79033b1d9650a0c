"""A textserve training run as a `Description`: our own TransformerClassifier is a source like
any other, with its test split to score (and its own graph forms: transforms.write_graph).

    description = describe_run(Path("runs/reviews"), ExportOptions(threads=1))
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from textserve.artifact import INPUT_NAMES, UNK_BY_NAME, Source
from textserve.export.description import Description, Split
from textserve.export.errors import ExportError
from textserve.export.options import ExportOptions
from textserve.model.checkpoint import Run


def describe_run(run_dir: str | Path, options: ExportOptions) -> Description:
    """The run's model, labels, tokenizer and test split; ExportError for a broken run."""
    run = open_run(run_dir, options.threads)
    return Description(
        model=run.model,
        inputs=list(INPUT_NAMES),
        labels=list(run.labels),
        labels_origin=f"{run.run_dir}/labels.json",
        activation="softmax",
        max_length=run.max_length,
        pad_token_id=run.pad_token_id,
        unk_token_id=UNK_BY_NAME,  # format 1's rule, which a run's tokenizer is trained for
        tokenizer_file=run.tokenizer_path,
        checkpoint=run.weights_path,
        source=asdict(Source()),  # textserve, TransformerClassifier
        vocab_size=run.config.vocab_size,
        split=Split(list(run.test_texts), list(run.test_labels), "the run's test split"),
        notes={"run_dir": str(run.run_dir)},
    )


def open_run(run_dir: str | Path, threads: int | None) -> Run:
    """load_run with torch's threads set first; its CheckpointError as an ExportError."""
    from textserve.model.checkpoint import CheckpointError, load_run

    if threads:
        torch.set_num_threads(threads)
    try:
        return load_run(run_dir)
    except CheckpointError as exc:
        raise ExportError(str(exc)) from None
