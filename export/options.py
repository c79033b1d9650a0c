"""How to export: one frozen, self-validating ExportOptions whose defaults feed the CLI.

    options = ExportOptions(quantize="int8", threads=1)      # ExportError on a bad value
    export_run("runs/reviews", "models", "reviews", options)   # export/pipeline.py

`textserve export` and `textserve setup-default` build it once at the edge from the same flags,
each with a TEXTSERVE_EXPORT_* environment fallback (add_arguments / from_args); nothing below
reads flags or the environment. No torch here: `textserve --help` imports this module.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from textserve.artifact import ACTIVATIONS
from textserve.cli import CliError, env_flag
from textserve.export.errors import ExportError

ENV_PREFIX = "TEXTSERVE_EXPORT_"
QUANTIZE_CHOICES = ("int8",)
# 18: the opset torch's exporters target natively and that every onnxruntime >= 1.14 implements.
DEFAULT_OPSET = 18
MIN_OPSET = 17
EXPORTERS = ("torchscript", "dynamo")
# Why TorchScript and the padding-free graph by default: export/transforms.py's measurements.
DEFAULT_EXPORTER = "torchscript"
DEFAULT_PADDING_FREE = True
FP32_ATOL = 1e-4  # the bound on max |Δlogit| for fp32
FP32_RTOL = 0.0
TRUNCATION_SIDES = ("right", "left")


@dataclass(frozen=True)
class ExportOptions:
    quantize: str | None = None  # "int8": publish a dynamically quantized graph
    fp16: bool = False  # publish a float16 graph (for the CUDA provider)
    max_accuracy_drop: float = 1.0  # points of test accuracy int8/fp16 may lose
    optimize: bool = True  # onnxruntime's offline optimization (and its transformer optimizer)
    opset: int = DEFAULT_OPSET
    exporter: str = DEFAULT_EXPORTER  # torch.onnx exporter: torchscript | dynamo
    padding_free: bool = DEFAULT_PADDING_FREE  # textserve runs: the padding-free graph
    atol: float = FP32_ATOL  # fp32 parity: |onnx - torch| <= atol + rtol·|torch|
    rtol: float = FP32_RTOL
    threads: int | None = None  # CPU threads for torch and onnxruntime (None: their defaults)
    # Hugging Face folders and --module (a run brings its own):
    max_length: int | None = None  # a cap on the derived max_length
    truncation_side: str = "right"  # which end of an over-long text is cut
    trust_remote_code: bool = False  # run a model folder's own Python code (auto_map)
    test_data: Path | None = None  # a labelled split scored into the manifest's test_accuracy
    # what turns logits into scores; None: softmax for --module, problem_type for a folder
    activation: str | None = None

    def __post_init__(self) -> None:
        if self.quantize is not None and self.quantize not in QUANTIZE_CHOICES:
            raise ExportError(
                f"quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {self.quantize!r}"
            )
        if self.quantize and self.fp16:
            raise ExportError(
                "choose one of --quantize int8 and --fp16: a version has one precision"
            )
        if not self.max_accuracy_drop >= 0:
            raise ExportError(
                f"max accuracy drop must be >= 0 points, got {self.max_accuracy_drop}"
            )
        if self.opset < MIN_OPSET:
            raise ExportError(f"opset must be >= {MIN_OPSET}, got {self.opset}")
        if self.exporter not in EXPORTERS:
            raise ExportError(
                f"exporter must be one of {', '.join(EXPORTERS)}, got {self.exporter!r}"
            )
        if not (self.atol >= 0 and self.rtol >= 0):
            raise ExportError(f"tolerances must be >= 0, got atol={self.atol} rtol={self.rtol}")
        if self.threads is not None and self.threads < 1:
            raise ExportError(f"--threads must be >= 1, got {self.threads}")
        if self.max_length is not None and self.max_length < 1:
            raise ExportError(f"--max-length must be >= 1, got {self.max_length}")
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise ExportError(
                f"--activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}"
            )
        if self.truncation_side not in TRUNCATION_SIDES:
            raise ExportError(
                f"--truncation-side must be one of {', '.join(TRUNCATION_SIDES)}, "
                f"got {self.truncation_side!r}"
            )


_DEFAULTS = ExportOptions()
# Switches: flag -> (field, the value the flag sets). Environment: ENV_PREFIX + flag.
_SWITCHES = {
    "fp16": ("fp16", True),
    "no-optimize": ("optimize", False),
    "no-padding-free": ("padding_free", False),
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def add_arguments(parser: argparse.ArgumentParser, *, all_sources: bool = True) -> None:
    """The options' flags (defaults from ExportOptions, TEXTSERVE_EXPORT_* fallbacks).

    all_sources: also the flags only Hugging Face folders and --module use (`setup-default`
    exports our own run).
    """
    d = _DEFAULTS

    def flag(name: str, help: str, **kwargs: Any) -> None:
        default = getattr(d, name.replace("-", "_"))
        env_flag(
            parser, ENV_PREFIX, name, None if default is None else str(default), help, **kwargs
        )

    flag("quantize", "publish a dynamically quantized INT8 graph", choices=QUANTIZE_CHOICES)
    parser.add_argument(
        "--fp16",
        action="store_true",
        default=None,
        help=f"publish a float16 graph (for the CUDA provider) [{ENV_PREFIX}FP16]",
    )
    flag(
        "max-accuracy-drop",
        "refuse int8/fp16 if test accuracy drops more than this many "
        f"points ({d.max_accuracy_drop:g})",
        type=float,
        metavar="POINTS",
    )
    parser.add_argument(
        "--no-optimize",
        action="store_true",
        default=None,
        help="publish the exporter's graph without onnxruntime's offline optimization "
        f"[{ENV_PREFIX}NO_OPTIMIZE]",
    )
    flag("opset", f"ONNX opset, >= {MIN_OPSET} ({d.opset})", type=int)
    flag(
        "exporter",
        "torch.onnx exporter (torchscript: faster export and graph, see "
        f"export/transforms.py; default {d.exporter})",
        choices=EXPORTERS,
    )
    parser.add_argument(
        "--no-padding-free",
        action="store_true",
        default=None,
        help="export the model's dense graph, computing padding positions too (default for a "
        "textserve run: the padding-free graph of export/padding_free.py, ~2x faster on CPU at "
        f"batch 32) [{ENV_PREFIX}NO_PADDING_FREE]",
    )
    flag("threads", "CPU threads for torch and onnxruntime", type=int)
    if not all_sources:
        return
    flag("max-length", "cap the model's max_length (tokens) at this", type=int)
    flag(
        "truncation-side",
        f"cut over-long texts on this side ({d.truncation_side})",
        choices=TRUNCATION_SIDES,
    )
    flag(
        "activation",
        "what turns logits into scores: softmax (one label per text), sigmoid (multi-label: "
        "each label on its own, listed over a threshold) or none (regression: the raw "
        "output); default: softmax for --module, the config's problem_type for a folder",
        choices=ACTIVATIONS,
    )
    flag(
        "test-data",
        "a labelled CSV/JSONL/Parquet split (text,label) scored into the manifest's test_accuracy",
        type=Path,
    )
    # No environment fallback: running a folder's code must be asked for where it is run.
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow a Hugging Face folder's own Python code (config auto_map) to run",
    )


def from_args(args: argparse.Namespace) -> ExportOptions:
    """ExportOptions from parsed flags, switches falling back to the environment.

    CliError (one line, exit 2) for a bad switch value or a bad option."""
    given: dict[str, Any] = {}
    names = {f.name for f in fields(ExportOptions)}
    for name in names:
        value = getattr(args, name, None)
        if value is not None and name not in ("fp16", "optimize", "padding_free"):
            given[name] = value
    for flag, (name, on) in _SWITCHES.items():
        value = getattr(args, flag.replace("-", "_"))
        env = ENV_PREFIX + flag.upper().replace("-", "_")
        if value is None:
            value = _env_switch(env)
        if value:
            given[name] = on
    given["trust_remote_code"] = bool(getattr(args, "trust_remote_code", False))
    try:
        return ExportOptions(**given)
    except ExportError as exc:
        raise CliError(str(exc)) from None


def _env_switch(env: str) -> bool:
    raw = os.environ.get(env, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise CliError(f"{env}={raw!r}: expected one of 1, true, yes, on, 0, false, no, off")
