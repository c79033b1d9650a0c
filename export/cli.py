"""`textserve export RUN_DIR`: export a training run to ONNX as the next version of a model.

Checks before publishing: onnx.checker (full), the graph contract, parity with PyTorch at batch
1/7/64 × length 1/5/37/max_length (max |Δlogit| <= 1e-4 for fp32), 100% argmax agreement on the
test split; the same again after onnxruntime's offline optimization; for --quantize int8 and
--fp16 the test accuracy may drop at most --max-accuracy-drop points. Exit status: 0 published,
1 a check failed (nothing published), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from textserve.cli import env_flag
from textserve.export import options

# No torch/onnx here: `textserve --help` imports this module; run() imports the exporter.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run directory (runs/...)")
    add_destination(parser)
    options.add_arguments(parser, foreign=False)
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")


def add_destination(parser: argparse.ArgumentParser) -> None:
    """--repository and --name, as `export` and `setup-default` both take them."""
    env_flag(parser, "TEXTSERVE_", "repository", "models", "the model repository (default: models)",
             type=Path)  # fmt: skip
    env_flag(parser, "TEXTSERVE_", "name", "default", "model name: the version goes to "
             "REPOSITORY/NAME/<N>/ (default: default)", env="TEXTSERVE_MODEL")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from textserve.cli import CliError

    opts = options.from_args(args)
    from textserve.artifact import MODEL_FILE, Manifest
    from textserve.export.errors import CheckFailed, ExportError
    from textserve.export.onnx_export import export_run

    try:
        version_dir = export_run(args.run_dir, args.repository, args.name, opts)
    except CheckFailed as exc:
        # A model that fails a check is a result, not a usage error: exit 1, not 2.
        print(f"textserve export: {exc}; nothing was published", file=sys.stderr)
        return 1
    except ExportError as exc:
        raise CliError(str(exc)) from None
    manifest = Manifest.read(version_dir)
    if args.json:
        print(manifest.to_json(), end="")
        return 0
    size = (version_dir / MODEL_FILE).stat().st_size
    print(
        f"published {version_dir}: {manifest.precision}, opset {manifest.opset}, "
        f"{size / 1e6:.2f} MB, test accuracy {manifest.test_accuracy:.2%}, "
        f"max |Δlogit| {manifest.parity['max_abs_logit_diff']:.2g}, "
        f"argmax agreement {manifest.parity['argmax_agreement']:.2%}"
    )
    quant = manifest.extra.get("quantization") or manifest.extra.get("fp16")
    if quant:
        print(
            f"  vs fp32: test accuracy {quant['fp32_test_accuracy']:.2%} → "
            f"{manifest.test_accuracy:.2%} ({quant['accuracy_delta_points']:+.2f} points)"
        )
    return 0
