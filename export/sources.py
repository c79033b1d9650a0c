"""What `textserve export SOURCE` was given, told apart by its files; and what a foreign source
(a Hugging Face folder, a --module factory) becomes before the export: a `Foreign` model.

    kind_of(Path("runs/reviews"))        # "textserve"
    kind_of(Path("my-finetuned-bert"))   # "huggingface"

No torch here: the CLI calls kind_of before anything heavy is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from textserve.export.errors import ExportError

HF_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# Files a slow (Python) tokenizer is saved as: vocab.txt (WordPiece), sentencepiece models,
# vocab.json + merges.txt (byte-level BPE).
SLOW_TOKENIZER_FILES = (
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "spm.model",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
RUN_FILES = 'config.json (with a "model" object), model.safetensors, tokenizer.json, labels.json'
HF_FILES = 'config.json (with "model_type"), model.safetensors or pytorch_model.bin, tokenizer.json'


def kind_of(source: Path) -> str:
    """ "textserve" (a training run) or "huggingface" (a save_pretrained folder); ExportError
    saying what either needs otherwise."""
    if not source.exists():
        raise ExportError(
            f"{source} does not exist: SOURCE is a textserve run folder or a Hugging Face model "
            "folder"
        )
    if not source.is_dir():
        raise ExportError(
            f"{source} is a file; SOURCE is a folder: a textserve run ({RUN_FILES}) or a "
            f"Hugging Face model folder ({HF_FILES})"
        )
    config = _read_config(source / "config.json")
    if isinstance(config.get("model"), dict) or (source / "labels.json").is_file():
        return "textserve"
    if isinstance(config.get("model_type"), str):
        check_huggingface_files(source)
        return "huggingface"
    raise ExportError(
        f"{source} is neither a textserve run folder ({RUN_FILES}) nor a Hugging Face model "
        f"folder as save_pretrained writes it ({HF_FILES})"
    )


def check_huggingface_files(folder: Path) -> None:
    if not any((folder / name).is_file() for name in HF_WEIGHTS):
        raise ExportError(
            f"{folder} has a Hugging Face config.json but no weights: expected "
            "model.safetensors or pytorch_model.bin (as save_pretrained writes them)"
        )
    if not (folder / "tokenizer.json").is_file():
        slow = [n for n in SLOW_TOKENIZER_FILES if (folder / n).is_file()]
        found = f" (it has the slow tokenizer's {', '.join(slow)})" if slow else ""
        raise ExportError(
            f"{folder} has no tokenizer.json, the fast tokenizer's file textserve serves with"
            f'{found}; convert it once with: python -c "from transformers import AutoTokenizer; '
            f"AutoTokenizer.from_pretrained('{folder}').save_pretrained('{folder}')\""
        )


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"{path} is not readable JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


@dataclass
class Foreign:
    """A model that is not a textserve run, ready to export: a torch module called with the
    graph's inputs by name (`model(**inputs)` → logits) and everything the manifest says."""

    model: Any  # torch.nn.Module: model(input_ids=…, attention_mask=…[, token_type_ids=…])
    inputs: list[str]  # graph inputs, in the order forward() takes them
    labels: list[str]
    activation: str  # softmax | sigmoid | none
    max_length: int
    pad_token_id: int
    unk_token_id: int | None
    tokenizer_file: Path
    checkpoint: Path  # hashed into source_checkpoint_sha256
    source: dict[str, Any]  # kind, architecture, model_type
    vocab_size: int
    type_vocab_size: int = 0  # token_type_ids take values below this (inputs has it when > 1)
    folder: Path | None = None  # a Hugging Face folder: checked against transformers itself
    hf_model: Any = None  # the transformers model, for its pipeline
    ort_model_type: str | None = None  # onnxruntime.transformers.optimizer's model type
    shape: tuple[int, int] = (0, 0)  # (attention heads, hidden size) for it; 0: read the graph
    extra: dict[str, Any] = field(default_factory=dict)
