"""What a source folder holds, told apart by its files: a textserve run or a Hugging Face
model folder as save_pretrained writes it.

    kind_of(Path("runs/reviews"))        # "textserve"
    kind_of(Path("my-finetuned-bert"))   # "huggingface"

No torch here: only files are read.
"""

from __future__ import annotations

import json
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
