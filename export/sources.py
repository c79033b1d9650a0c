"""What `textserve export` takes a model from: a source is anything with
`describe(options) -> Description` (export/description.py), the one description the export
pipeline (export/pipeline.py) takes through the same checks, whatever it came from.

    RunSource(Path("runs/reviews"))                        # a training run
    HuggingFaceSource(Path("my-finetuned-bert"))           # a save_pretrained folder
    ModuleSource("pkg.mod:build", Path("tokenizer.json"), ["neg", "pos"])  # --module
    PathSource(Path(argv_source))                          # SOURCE, told apart by its files
    export_source(PathSource(Path("my-finetuned-bert")), "models", "bert")

No torch here: a source is built before anything heavy is imported; describe() imports the
loader it needs (export/run_source.py, export/huggingface.py, export/module_source.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from textserve.export.description import Description, Split
from textserve.export.errors import ExportError
from textserve.export.folders import kind_of
from textserve.export.options import ExportOptions


class ExportSource(Protocol):
    """Where a model comes from: describe() loads it (ExportError saying what to fix)."""

    def describe(self, options: ExportOptions) -> Description: ...


# Options a run does not take: it brings its own max_length, test split, truncation, activation.
_NOT_FOR_RUNS: dict[str, Callable[[ExportOptions], object]] = {
    "--max-length": lambda o: o.max_length,
    "--test-data": lambda o: o.test_data,
    "--trust-remote-code": lambda o: o.trust_remote_code,
    "--truncation-side": lambda o: o.truncation_side != "right",
    "--activation": lambda o: o.activation,
}


@dataclass(frozen=True)
class RunSource:
    """A textserve training run (`textserve train`'s output folder)."""

    run_dir: Path

    def describe(self, options: ExportOptions) -> Description:
        given = [flag for flag, value in _NOT_FOR_RUNS.items() if value(options)]
        if given:
            raise ExportError(
                f"{', '.join(given)}: for Hugging Face folders and --module; a run "
                "brings its own max_length, test split, truncation and activation"
            )
        from textserve.export.run_source import describe_run

        return describe_run(self.run_dir, options)


@dataclass(frozen=True)
class HuggingFaceSource:
    """A local Hugging Face sequence or token classifier folder, as save_pretrained writes it."""

    folder: Path

    def describe(self, options: ExportOptions) -> Description:
        _refuse_fp16(options)
        from textserve.export.huggingface import load_folder

        return with_test_data(load_folder(self.folder, options), options.test_data)


@dataclass(frozen=True)
class ModuleSource:
    """`--module pkg.mod:factory` with its tokenizer.json and labels."""

    spec: str
    tokenizer_file: Path | None
    labels: list[str]

    def describe(self, options: ExportOptions) -> Description:
        _refuse_fp16(options)
        from textserve.export.module_source import load_module

        loaded = load_module(self.spec, self.tokenizer_file, self.labels, options)
        return with_test_data(loaded, options.test_data)


@dataclass(frozen=True)
class PathSource:
    """SOURCE as given: a run or a Hugging Face folder, told apart by its files (kind_of)."""

    path: Path

    def describe(self, options: ExportOptions) -> Description:
        if kind_of(self.path) == "textserve":
            return RunSource(self.path).describe(options)
        return HuggingFaceSource(self.path).describe(options)


def _refuse_fp16(options: ExportOptions) -> None:
    if options.fp16:
        raise ExportError(
            "--fp16 is for textserve runs; a Hugging Face folder or a --module exports as "
            "fp32 or int8"
        )


def with_test_data(description: Description, path: Path | None) -> Description:
    """The description with --test-data as its split; ExportError for labels it does not have."""
    if path is None:
        return description
    if description.activation == "none":
        raise ExportError("--test-data scores classifiers; a regression model has no accuracy")
    if description.per_token:
        raise ExportError(
            "--test-data scores a label per text; a token classifier labels each token "
            "(its export is checked against transformers' token-classification pipeline)"
        )
    from textserve.model.data import DataError, load_labelled

    try:
        data = load_labelled(path)
    except DataError as exc:
        raise ExportError(str(exc)) from None
    labels = description.labels
    index = {label: i for i, label in enumerate(labels)}
    unknown = sorted({str(label) for label in data.labels} - set(index))
    if unknown:
        raise ExportError(
            f"{path}: labels {', '.join(map(repr, unknown[:5]))} are not the model's "
            f"({', '.join(labels[:10])})"
        )
    split = Split(list(data.texts), [index[str(label)] for label in data.labels])
    return replace(description, split=split)
