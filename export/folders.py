"""What a source folder holds, told apart by its files: a textserve run or a Hugging Face
model folder as save_pretrained writes it; and whether those files are what their names say.

    kind_of(Path("runs/reviews"))        # "textserve"
    kind_of(Path("my-finetuned-bert"))   # "huggingface"
    check_huggingface_files(folder)      # ExportError naming the file and what is wrong

A folder is a user's, handed over as it is: each file transformers or tokenizers would read is
checked first (a regular file, JSON that is an object, a tokenizers file, a safetensors file
that is whole, shards and symlinks inside the folder), so that a broken one is one line naming
it, never a traceback from deep inside a library, and nothing outside the folder is read.
No torch here: only files are read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from textserve.artifact import shown
from textserve.export.config_values import check_tokenizer_config, kind
from textserve.export.errors import ExportError, first_line

HF_WEIGHTS = (  # in the order transformers picks them: the first present is loaded
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
# JSON files transformers reads from a folder: each must be an object
JSON_FILES = (
    "config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILE = "tokenizer.json"
RUN_FILES = 'config.json (with a "model" object), model.safetensors, tokenizer.json, labels.json'
HF_FILES = 'config.json (with "model_type"), model.safetensors or pytorch_model.bin, tokenizer.json'
# bytes: larger than any config or tokenizer file (a 256k-token tokenizer.json is ~35 MB); a
# bigger one is not parsed into memory
JSON_MOST = 256 * 2**20


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
    check_contained(source)
    config_path = source / "config.json"
    config = read_json_object(config_path) if os.path.lexists(config_path) else {}
    if isinstance(config.get("model"), dict) or (source / "labels.json").is_file():
        return "textserve"
    model_type = config.get("model_type")
    if isinstance(model_type, str):
        check_huggingface_files(source)
        return "huggingface"
    if model_type is not None:
        raise ExportError(
            f'{config_path}\'s "model_type" is {kind(model_type)}, not a string naming the '
            'architecture (as save_pretrained writes it, e.g. "bert")'
        )
    raise ExportError(
        f"{source} is neither a textserve run folder ({RUN_FILES}) nor a Hugging Face model "
        f"folder as save_pretrained writes it ({HF_FILES})"
    )


def roots(folder: Path) -> list[Path]:
    """Where the files of `folder` may lie: the folder itself and, for a snapshot of the Hugging
    Face cache (hub/models--org--name/snapshots/<revision>/, every file a relative symlink into
    the blobs folder beside snapshots/), that repository's own blobs folder: the same model's
    files."""
    root = folder.resolve()
    blobs = root.parent.parent / "blobs"
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        return [root, blobs] if blobs.is_dir() else [root]
    return [root]


def _within(path: Path, allowed: list[Path]) -> bool:
    real = Path(os.path.realpath(path))
    return any(real.is_relative_to(root) for root in allowed)


def check_contained(folder: Path) -> None:
    """ExportError for a symlink in `folder` to anything outside it (roots(): a Hugging Face
    cache snapshot's blobs count as inside): nothing outside the folder handed over is read (a
    link to ~/.ssh/id_rsa named tokenizer.json would be published)."""
    allowed = roots(folder)
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        raise ExportError(f"{folder} cannot be listed: {exc.strerror or exc}") from None
    for path in entries:
        if path.is_symlink() and not _within(path, allowed):
            raise ExportError(
                f"{path} is a symlink to {shown(os.readlink(path), limit=200)}, outside "
                f"{folder}: textserve reads nothing outside the folder it exports (copy the file "
                "in, e.g. cp -L)"
            )


def is_inside(folder: Path, name: str) -> bool:
    """Whether folder/name stays inside the folder: no "..", no absolute path, no symlink out
    (a name a file of the folder gives, as an index's shards)."""
    try:
        return _within(folder / name, roots(folder))
    except ValueError:  # a NUL in the name: no path at all
        return False


def check_regular(path: Path) -> None:
    """ExportError if `path` exists and is not a regular file (a directory, a FIFO, ...)."""
    if path.is_dir():
        raise ExportError(f"{path} is a directory, not a file")
    if os.path.lexists(path) and not path.is_file():
        raise ExportError(f"{path} is not a regular file")


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; ExportError naming the file and what is wrong otherwise."""
    check_regular(path)
    try:
        size = path.stat().st_size
        if size > JSON_MOST:
            raise ExportError(f"{path} is {size:,} bytes, more than a JSON file of a model holds")
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ExportError(f"{path} cannot be read: {exc.strerror or exc}") from None
    except RecursionError:
        raise ExportError(f"{path} is not readable JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, over-long integers
        raise ExportError(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ExportError(f"{path} holds {kind(data)}, not a JSON object")
    return data


def check_huggingface_files(folder: Path) -> None:
    """ExportError unless the folder has weights and a tokenizer.json, and every file
    transformers would read from it is what its name says (see the module docstring)."""
    check_contained(folder)
    for name in (*HF_WEIGHTS, *JSON_FILES, TOKENIZER_FILE):
        check_regular(folder / name)
    if not any((folder / name).is_file() for name in HF_WEIGHTS):
        raise ExportError(
            f"{folder} has a Hugging Face config.json but no weights: expected "
            "model.safetensors or pytorch_model.bin (as save_pretrained writes them)"
        )
    if not (folder / TOKENIZER_FILE).is_file():
        slow = [n for n in SLOW_TOKENIZER_FILES if (folder / n).is_file()]
        found = f" (it has the slow tokenizer's {', '.join(slow)})" if slow else ""
        raise ExportError(
            f"{folder} has no tokenizer.json, the fast tokenizer's file textserve serves with"
            f'{found}; convert it once with: python -c "from transformers import AutoTokenizer; '
            f"AutoTokenizer.from_pretrained('{folder}').save_pretrained('{folder}')\""
        )
    for name in JSON_FILES:
        if (folder / name).is_file():
            read_json_object(folder / name)
    if (folder / "tokenizer_config.json").is_file():
        path = folder / "tokenizer_config.json"
        check_tokenizer_config(read_json_object(path), path)
    check_tokenizer_file(folder / TOKENIZER_FILE)
    weight_files(folder)  # each file's header is read when its values are counted (loading.py)


def check_tokenizer_file(path: Path) -> None:
    """ExportError unless `path` is a tokenizers file (tokenizer.json) the library loads."""
    from tokenizers import Tokenizer

    read_json_object(path)
    try:
        Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises Exception itself, with serde's message
        raise ExportError(f"{path} is not a tokenizers file: {first_line(exc)}") from None


def weight_files(folder: Path) -> list[Path]:
    """The files transformers loads the folder's weights from: the first of HF_WEIGHTS present
    or, for an index, the shards its weight_map names; ExportError for an index that is not
    one, or a shard that is missing or outside the folder."""
    name = next(n for n in HF_WEIGHTS if (folder / n).is_file())
    if not name.endswith(".index.json"):
        return [folder / name]
    index = folder / name
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ExportError(
            f'{index} has no "weight_map" object (weight name → shard file), as save_pretrained '
            "writes it"
        )
    shards = []
    for shard in sorted({str(v) for v in weight_map.values()}):
        if not is_inside(folder, shard):
            raise ExportError(
                f"{index}: the weight_map names the shard {shown(shard, limit=200)}, outside "
                f"{folder}: textserve reads nothing outside the folder it exports"
            )
        path = folder / shard
        check_regular(path)
        if not path.is_file():
            raise ExportError(f"{index}: the weight_map names {shown(shard)}, not in {folder}")
        shards.append(path)
    return shards


def safetensors_values(path: Path) -> int:
    """How many values the safetensors file holds, read from its header; ExportError naming
    the file unless it is a whole safetensors file (not truncated, its header JSON)."""
    from safetensors import SafetensorError, safe_open

    try:
        with open(path, "rb"):  # safetensors says ENOENT where it may not read (EACCES)
            pass
        with safe_open(path, framework="numpy") as weights:
            shapes = [weights.get_slice(key).get_shape() for key in weights.keys()]  # noqa: SIM118 (not a dict)
    except OSError as exc:
        raise ExportError(f"{path} cannot be read: {exc.strerror or exc}") from None
    except SafetensorError as exc:
        reason = first_line(exc).removeprefix("Error while deserializing header: ")
        hint = " (truncated?)" if "incomplete" in reason or "too small" in reason else ""
        raise ExportError(f"{path} is not a whole safetensors file: {reason}{hint}") from None
    total = 0
    for shape in shapes:
        count = 1
        for size in shape:
            count *= size
        total += count
    return total
