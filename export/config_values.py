"""What a Hugging Face folder's config.json and tokenizer_config.json may say, checked before
transformers reads them.

    check_config(raw, folder / "config.json")
    check_tokenizer_config(raw, folder / "tokenizer_config.json")

transformers trusts these numbers: it builds tensors, label maps and layers of the sizes they
give, so a string where a size belongs ends in a TypeError deep inside it, a zero in a division,
and a huge number exhausts memory before any check of ours could run (num_labels 10**12 is a
dict of 10**12 names). Each field is checked for its type and a range no classifier leaves, and
refused in one line naming the file and the field. No torch here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from textserve.artifact import shown
from textserve.export.errors import ExportError

MOST_LABELS = 100_000  # the manifest schema's maxItems of labels
# field: (least, most). Sizes a classifier's config holds under the names transformers' configs
# give them; the bounds are far beyond any released model's and far below what exhausts memory
# or time while the model is built (its weights are then compared with the checkpoint's).
SIZES: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 2**24),
    "max_position_embeddings": (1, 2**24),
    "type_vocab_size": (0, 2**16),
    "hidden_size": (1, 2**18),
    "dim": (1, 2**18),
    "embedding_size": (1, 2**18),
    "intermediate_size": (1, 2**20),
    "hidden_dim": (1, 2**20),
    "head_dim": (1, 2**14),
    "num_hidden_layers": (0, 1024),
    "n_layers": (0, 1024),
    "num_attention_heads": (1, 2**12),
    "n_heads": (1, 2**12),
    "num_key_value_heads": (1, 2**12),
    "num_labels": (1, MOST_LABELS),
}
_INDEX = re.compile(r"^(0|[1-9][0-9]{0,5})$")  # a label index as JSON keys spell it
_KINDS = {list: "an array", dict: "an object", str: "a string", bool: "a boolean", int: "a number",
          float: "a number", type(None): "null"}  # fmt: skip


def kind(value: Any) -> str:
    """What a JSON value is, for a message: "a number", "an array", ..."""
    return _KINDS.get(type(value), "a JSON value")


def check_config(raw: dict[str, Any], path: Path) -> None:
    """ExportError naming the field of config.json (at `path`) whose value transformers could
    not build a classifier from (see the module docstring)."""
    for field, (least, most) in SIZES.items():
        value = raw.get(field)
        for one in value if isinstance(value, list) else [value]:  # per-layer sizes: a list
            if one is not None and not _is_int(one, least, most):
                raise ExportError(
                    f'{path}\'s "{field}" is {_value(one)}: expected an integer from {least} '
                    f"to {most:,}"
                )
    pad, vocab = raw.get("pad_token_id"), raw.get("vocab_size")
    if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int)):
        raise ExportError(f'{path}\'s "pad_token_id" is {_value(pad)}: expected a token id')
    if isinstance(pad, int) and isinstance(vocab, int) and pad >= vocab:
        raise ExportError(
            f'{path}\'s "pad_token_id" {pad} is past the vocabulary ("vocab_size" {vocab})'
        )
    problem = raw.get("problem_type")
    if problem is not None and not isinstance(problem, str):
        raise ExportError(
            f'{path}\'s "problem_type" is {kind(problem)}: expected "single_label_'
            'classification", "multi_label_classification" or "regression"'
        )
    _check_id2label(raw.get("id2label"), path)


def _check_id2label(id2label: Any, path: Path) -> None:
    if id2label is None:
        return
    where = f'{path}\'s "id2label"'
    if not isinstance(id2label, dict):
        raise ExportError(f"{where} is {kind(id2label)}: expected an object of index → label")
    for key, label in id2label.items():
        if not _INDEX.match(key) or int(key) >= MOST_LABELS:
            raise ExportError(
                f"{where} has the key {shown(key)}: its keys are label indices, 0 to "
                f"{MOST_LABELS - 1:,} in decimal"
            )
        if not isinstance(label, str):
            raise ExportError(f"{where}: label {key} is {kind(label)}, not a string")


def check_tokenizer_config(raw: dict[str, Any], path: Path) -> None:
    """ExportError for a tokenizer_config.json whose model_max_length is not a length or whose
    tokenizer_class is not a class name."""
    length = raw.get("model_max_length")
    if length is not None and (
        isinstance(length, bool) or not isinstance(length, int | float) or not length >= 1
    ):
        raise ExportError(
            f'{path}\'s "model_max_length" is {_value(length)}: expected the longest input the '
            "model takes, a positive integer"
        )
    name = raw.get("tokenizer_class")
    if name is not None and not isinstance(name, str):
        raise ExportError(f'{path}\'s "tokenizer_class" is {kind(name)}, not a class name')


def _is_int(value: Any, least: int, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= most


def _value(value: Any) -> str:
    """A config value as a message shows it: a number as it is, anything else by its kind."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:,}" if isinstance(value, int) else repr(value)
    if isinstance(value, str):
        return f"the string {shown(value, limit=40)}"
    return kind(value)
