"""What no export publishes, whatever its source: labels the manifest, a log line and a client
cannot carry as they are, and a tokenizer whose ids run past the model's embedding.

    check_labels(["negative", "positive"], "config.json's id2label")
    check_vocabulary(Path("tokenizer.json"), rows=30522)

A label is served as it is: in JSON answers, in gRPC messages, in access-log lines and metrics.
One with a newline or a NUL forges a log line; an empty one, or two outputs of one name, cannot
be told apart by a client; the manifest schema takes at most 1,024 characters. A token id the
embedding has no row for makes the graph fail (onnxruntime's Gather refuses it), so the server
refuses the version: refused here instead, before anything is built. No torch here.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from pathlib import Path

from textserve.artifact import shown
from textserve.export.errors import ExportError
from textserve.tokenization import load_tokenizer

LABEL_MOST = 1024  # characters: the manifest schema's maxLength of a label
# Unicode categories no label holds: controls (C0, DEL, C1) and the line and paragraph
# separators a log reader may break a line at
_REFUSED = ("Cc", "Zl", "Zp")


def check_labels(labels: Sequence[str], where: str) -> None:
    """ExportError naming the first label (by index, shown escaped and cut) that is empty, over
    LABEL_MOST characters, holds a control character, or names an earlier label's output too."""
    first: dict[str, int] = {}
    for index, label in enumerate(labels):
        problem = label_problem(label)
        if problem is None and label in first:
            problem = f"is label {first[label]}'s name too: each output needs its own name"
        if problem is not None:
            raise ExportError(f"{where}: label {index} ({shown(label)}) {problem}")
        first[label] = index


def label_problem(label: str) -> str | None:
    """What is wrong with one label name, or None."""
    if not label:
        return "is empty"
    if len(label) > LABEL_MOST:
        return f"is {len(label):,} characters long, over the {LABEL_MOST:,} a manifest takes"
    bad = next((c for c in label if unicodedata.category(c) in _REFUSED), None)
    if bad is not None:
        return f"holds the control character {bad!a}, which would go raw into answers and log lines"
    return None


def check_vocabulary(tokenizer_file: Path, rows: int) -> None:
    """ExportError unless every id of the tokenizer (added tokens too) has a row in the model's
    input embedding of `rows` rows."""
    vocab = load_tokenizer(tokenizer_file).get_vocab(with_added_tokens=True)
    if not vocab:
        raise ExportError(f"{tokenizer_file}: the tokenizer has no tokens")
    token, largest = max(vocab.items(), key=lambda item: item[1])
    if largest >= rows:
        raise ExportError(
            f"{tokenizer_file}: the tokenizer's ids go up to {largest} ({shown(token)}), the "
            f"model's embedding has {rows} rows (ids 0 to {rows - 1}): the server could not run "
            "such a token; resize the model's embeddings to the tokenizer (transformers: "
            "model.resize_token_embeddings(len(tokenizer))) and save it again"
        )
