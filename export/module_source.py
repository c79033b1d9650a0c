"""`--module package.module:factory`: any torch.nn.Module with the (input_ids, attention_mask)
→ logits contract, with its tokenizer.json and labels; its scores are
the softmax of the logits unless --activation says sigmoid (multi-label) or none (regression).
A `Description` like any other source's.

    description = load_module("mypkg.models:build", Path("tokenizer.json"), ["neg", "pos"], opts)

The factory is called with no arguments and returns the module (weights loaded). Its logits
must be float (B, len(labels)); the graph is exported and checked like any other.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
from pathlib import Path
from typing import Any

import torch

from textserve.export.description import Description
from textserve.export.errors import ExportError
from textserve.export.options import ExportOptions

PAD_NAMES = ("[PAD]", "<pad>", "<|pad|>", "[pad]")


class _Positional(torch.nn.Module):
    """The user's module called as its contract says: positionally, ids then mask."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.module(input_ids, attention_mask)
        return out.logits if hasattr(out, "logits") else out


def load_module(
    spec: str, tokenizer_file: Path | None, labels: list[str] | None, opts: ExportOptions
) -> Description:
    if tokenizer_file is None or not labels:
        raise ExportError("--module needs --tokenizer TOKENIZER_JSON and --labels A,B,...")
    if opts.max_length is None:
        raise ExportError("--module needs --max-length: the longest input the model takes")
    if len(set(labels)) != len(labels):
        raise ExportError(f"--labels has a label twice: {labels}")
    activation = opts.activation or "softmax"
    if activation == "none" and len(labels) != 1:
        raise ExportError(
            f"--activation none (regression) serves one output, got {len(labels)} labels"
        )
    factory = _factory(spec)
    tokenizer = _tokenizer(tokenizer_file)
    try:
        module = factory()
    except Exception as exc:  # the user's code: any failure is theirs to read, in one line
        raise ExportError(
            f"--module {spec}: the factory failed: {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(module, torch.nn.Module):
        raise ExportError(
            f"--module {spec} returned a {type(module).__name__}, not a torch.nn.Module"
        )
    if opts.threads:
        torch.set_num_threads(opts.threads)
    model = _Positional(module).eval()
    pad = _pad_id(tokenizer, tokenizer_file)
    _check_width(model, spec, len(labels), pad)
    vocab = tokenizer.get_vocab_size()
    return Description(
        model=model,
        inputs=["input_ids", "attention_mask"],
        labels=list(labels),
        labels_origin="--labels",
        activation=activation,
        max_length=opts.max_length,
        pad_token_id=pad,
        unk_token_id=_unk_id(tokenizer_file, tokenizer),
        tokenizer_file=tokenizer_file,
        checkpoint=Path(inspect.getfile(factory)),
        source={"kind": "module", "architecture": spec, "model_type": None},
        vocab_size=vocab,
        truncation_side=opts.truncation_side,
        versions={
            "module_sha256": hashlib.sha256(Path(inspect.getfile(factory)).read_bytes()).hexdigest()
        },
    )


def _factory(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ExportError(f"--module {spec!r}: expected package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module's own code failing on import
        raise ExportError(
            f"--module {spec}: cannot import {module_name}: {type(exc).__name__}: {exc}"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ExportError(f"--module {spec}: {module_name} has no callable {attr!r}")
    return factory


def _tokenizer(path: Path) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception type for a bad file
        raise ExportError(f"--tokenizer {path}: not a tokenizers file: {exc}") from None


def _pad_id(tokenizer: Any, path: Path) -> int:
    if tokenizer.padding is not None:
        return int(tokenizer.padding["pad_id"])
    for name in PAD_NAMES:
        if (idx := tokenizer.token_to_id(name)) is not None:
            return int(idx)
    raise ExportError(f"--tokenizer {path} has no pad token ({', '.join(PAD_NAMES)})")


def _unk_id(path: Path, tokenizer: Any) -> int | None:
    try:
        unk = json.loads(path.read_text(encoding="utf-8")).get("model", {}).get("unk_token")
    except (OSError, ValueError, AttributeError):
        return None
    idx = tokenizer.token_to_id(unk) if isinstance(unk, str) else None
    return None if idx is None else int(idx)


def _check_width(model: torch.nn.Module, spec: str, width: int, pad: int) -> None:
    ids = torch.tensor([[1, 2, 3], [1, pad, pad]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    try:
        with torch.inference_mode():
            logits = model(ids, mask)
    except Exception as exc:
        raise ExportError(
            f"--module {spec}: forward(input_ids, attention_mask) failed: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    shape = tuple(getattr(logits, "shape", ()))
    if len(shape) != 2 or shape != (2, width) or not torch.is_floating_point(logits):
        raise ExportError(
            f"--module {spec} gives logits of shape {list(shape)} for a batch of 2, expected "
            f"[2, {width}] (one per --labels entry)"
        )
