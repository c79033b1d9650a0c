"""`textserve export SOURCE`: export a model to ONNX, checked, as the next version of a model.

SOURCE is a textserve run folder (`textserve train`'s output) or a local Hugging Face model
folder (save_pretrained: config.json, model.safetensors or pytorch_model.bin, tokenizer.json) of
a sequence or token classifier, told apart by its files; or no SOURCE and `--module
package.module:factory` for any PyTorch classifier taking (input_ids, attention_mask), with
--tokenizer and --labels.

Every source goes through one pipeline (export/pipeline.py). Checks before publishing:
onnx.checker (full), the graph contract, parity with PyTorch at batch 1/7/64 × length
1/5/37/max_length (max |Δlogit| <= 1e-4 for fp32); for a Hugging Face folder, textserve's
tokenization equal to its AutoTokenizer's and served scores within 1e-4 of transformers'
pipeline (a token classifier's: character offsets too, and every token's label and score in
its token-classification pipeline); the optimizer's graph only if it passes them again and
runs faster; on a test split (a run's own, --test-data), 100% argmax agreement with PyTorch; for
--quantize int8 and --fp16 the accuracy may drop at most --max-accuracy-drop points. Exit
status: 0 published, 1 a check failed (nothing published), 2 bad input.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from textserve.artifact import shown
from textserve.cli import CliError, env_flag
from textserve.export import options

if TYPE_CHECKING:
    from textserve.export.sources import ExportSource

# No torch/onnx here: `textserve --help` imports this module; run() imports the exporter.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        type=Path,
        metavar="SOURCE",
        nargs="?",
        help="a run directory (runs/...) or a Hugging Face model folder",
    )
    add_destination(parser)
    options.add_arguments(parser)
    parser.add_argument(
        "--module",
        metavar="PKG.MOD:FACTORY",
        help="export the torch.nn.Module this factory returns (no SOURCE)",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        metavar="TOKENIZER_JSON",
        help="--module's tokenizer (a tokenizers tokenizer.json)",
    )
    parser.add_argument("--labels", help="--module's labels in logit order, comma-separated")
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")


def add_destination(parser: argparse.ArgumentParser) -> None:
    """--repository and --name, as `export` and `setup-default` both take them."""
    env_flag(
        parser,
        "TEXTSERVE_",
        "repository",
        "models",
        "the model repository (default: models)",
        type=Path,
    )
    env_flag(
        parser,
        "TEXTSERVE_",
        "name",
        "default",
        "model name: the version goes to REPOSITORY/NAME/<N>/ (default: default)",
        env="TEXTSERVE_MODEL",
    )


def run(args: argparse.Namespace) -> int:
    opts = options.from_args(args)
    from textserve.export.errors import CheckFailed, ExportError

    try:
        version_dir = _export(args, opts)
    except CheckFailed as exc:
        # A model that fails a check is a result, not a usage error: exit 1, not 2.
        print(f"textserve export: {one_line(str(exc))}; nothing was published", file=sys.stderr)
        return 1
    except ExportError as exc:
        raise CliError(one_line(str(exc))) from None
    _report(version_dir, args.json)
    return 0


def one_line(message: str) -> str:
    """The message as one line, its control characters escaped: a name it quotes (a folder's,
    a file's, a library's message) never starts a second line of stderr or forges one."""
    return _CONTROLS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), message)


# C0, DEL, C1 and the line and paragraph separators
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _export(args: argparse.Namespace, opts: options.ExportOptions) -> Path:
    source = _source(args)  # before torch is imported: a usage mistake is told at once
    from textserve.export.pipeline import export_source

    return export_source(source, args.repository, args.name, opts)


def _source(args: argparse.Namespace) -> ExportSource:
    """What SOURCE or --module names (nothing is read yet: the pipeline checks the name first)."""
    from textserve.export.sources import ModuleSource, PathSource

    if args.module:
        if args.source is not None:
            raise CliError("give SOURCE or --module, not both")
        labels = [x.strip() for x in (args.labels or "").split(",") if x.strip()]
        return ModuleSource(args.module, args.tokenizer, labels)
    if args.source is None:
        raise CliError("give SOURCE (a run or Hugging Face folder) or --module PKG.MOD:FACTORY")
    if args.tokenizer or args.labels:
        raise CliError("--tokenizer and --labels go with --module; a folder brings its own")
    return PathSource(args.source)


def nli_summary(labels: list[str], zero_shot: dict[str, int | None]) -> str:
    """An NLI model's zero-shot labels for the summary: "entailment label 0 'entailment',
    contradiction label 2 'contradiction'"."""
    found = [(k, i) for k in ("entailment", "contradiction") if (i := zero_shot[k]) is not None]
    said = ", ".join(f"{kind} label {i} {shown(labels[i])}" for kind, i in found)
    return said if len(found) == 2 else f"{said}, no contradiction label (no multi_label)"


def _report(version_dir: Path, as_json: bool) -> None:
    from textserve.artifact import MODEL_FILE, Manifest

    manifest = Manifest.read(version_dir)
    if as_json:
        print(manifest.to_json(), end="")
        return
    size = (version_dir / MODEL_FILE).stat().st_size
    accuracy = (
        "no test split"
        if manifest.test_accuracy is None
        else f"test accuracy {manifest.test_accuracy:.2%}"
    )
    agreement = manifest.parity.get("argmax_agreement")
    print(
        f"published {version_dir}: {manifest.precision}, opset {manifest.opset}, "
        f"{size / 1e6:.2f} MB, {accuracy}, "
        f"max |Δlogit| {manifest.parity['max_abs_logit_diff']:.2g}"
        + ("" if agreement is None else f", argmax agreement {agreement:.2%}")
    )
    served = manifest.parity.get("served_max_abs_score_diff")
    if served is not None:
        print(f"  served scores vs transformers' pipeline: max |Δ| {served:.2g}")
    if manifest.tags_tokens and manifest.tagging is not None:
        tags = manifest.tagging
        print(
            f"  token classification: {tags['scheme']} labels, aggregation {tags['aggregation']}, "
            f"ignoring {', '.join(tags['ignore_labels']) or 'no label'}, stride {tags['stride']}"
        )
    if manifest.zero_shot is not None:
        print(f"  zero-shot (NLI): {nli_summary(manifest.labels, manifest.zero_shot)}")
    quant = manifest.extra.get("quantization") or manifest.extra.get("fp16")
    if quant and "fp32_test_accuracy" in quant and manifest.test_accuracy is not None:
        print(
            f"  vs fp32: test accuracy {quant['fp32_test_accuracy']:.2%} → "
            f"{manifest.test_accuracy:.2%} ({quant['accuracy_delta_points']:+.2f} points)"
        )
