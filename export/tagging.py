"""What a token classifier's export reads from its folder beyond a sequence classifier's: the
label scheme its id2label spells, the manifest's tagging defaults, and whether its tokenizer's
character offsets can place an entity in the text.

    scheme = label_scheme(["O", "B-PER", "I-PER"], where)      # "BIO"
    tagging = tagging_defaults(labels, max_length=512, where)   # the manifest's `tagging`
    check_offsets(load_tokenizer(folder / "tokenizer.json"), where)

Schemes (what transformers' token-classification pipeline groups by): every label "O" or
"<P>-<TYPE>", P in B, I: BIO (IOB2, and IOB1, which uses the same prefixes); P in B, I, E, S:
IOBES; no label with such a prefix: plain (each label its own entity type). Anything else (a
"B-PER" beside a "PER", an "X-PER", a "B-" without a type) is refused, naming the label.
No torch here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from textserve.export.errors import ExportError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

OUTSIDE = "O"
DEFAULT_AGGREGATION = "simple"  # transformers' grouping of B-/I- runs into entities
# a prefix is one letter and a hyphen: "B-PER"; "first-name" is a plain label
_PREFIXED = re.compile(r"^([A-Za-z])-(.*)$", re.DOTALL)
_BIO, _IOBES = frozenset("BI"), frozenset("BIES")
# A text whose every letter some token's offsets must cover (ASCII letters: no tokenizer drops
# or merges them away), and texts whose offsets must stay inside them.
OFFSET_PROBE = "Ada Lovelace met Charles Babbage in London"
OFFSET_TEXTS = (
    OFFSET_PROBE,
    "Ünïcödé naïve café — crème brûlée, e\u0301 vs é",
    "北京欢迎你 東京 서울 🙂🎬👍🏽",
    "two  spaces,   three   and\ttabs",
)


def label_scheme(labels: Sequence[str], where: str) -> str:
    """BIO, IOBES or plain (see the module docstring); ExportError naming a label that fits
    none of them beside the others."""
    prefixes: set[str] = set()
    plain: list[str] = []
    for label in labels:
        if label == OUTSIDE:
            continue
        match = _PREFIXED.match(label)
        if match is None:
            plain.append(label)
        elif match.group(1) not in _IOBES or not match.group(2):
            raise ExportError(
                f"{where}: label {label!r} is neither O nor <B|I|E|S>-<TYPE> nor a plain label; "
                f"{_SCHEMES}"
            )
        else:
            prefixes.add(match.group(1))
    if not prefixes:
        return "plain"
    if plain:
        prefixed = next(label for label in labels if _PREFIXED.match(label))
        raise ExportError(
            f"{where}: label {plain[0]!r} has no B-/I- prefix beside {prefixed!r}: the label "
            f"scheme does not parse; {_SCHEMES}"
        )
    return "BIO" if prefixes <= _BIO else "IOBES"


_SCHEMES = (
    "the labels must be O and B-/I-<TYPE> (BIO), O and B-/I-/E-/S-<TYPE> (IOBES), or all "
    "without prefixes (plain)"
)


def tagging_defaults(labels: Sequence[str], max_length: int, where: str) -> dict[str, Any]:
    """The manifest's `tagging`: the scheme read from the labels, transformers' "simple"
    grouping, "O" never reported, windows overlapping by a quarter of max_length."""
    return {
        "scheme": label_scheme(labels, where),
        "aggregation": DEFAULT_AGGREGATION,
        "ignore_labels": [OUTSIDE] if OUTSIDE in labels else [],
        "stride": max_length // 4,
    }


def check_offsets(tokenizer: Tokenizer, where: str) -> None:
    """ExportError ("offsets unsupported by the tokenizer") unless the tokenizer's character
    offsets place its tokens in the text: inside it, start <= end, and together covering every
    letter of OFFSET_PROBE. Special tokens (the template's) are not looked at."""
    tokenizer.no_padding()
    tokenizer.no_truncation()
    for text, encoding in zip(
        OFFSET_TEXTS, tokenizer.encode_batch(list(OFFSET_TEXTS)), strict=True
    ):
        spans = [
            span
            for span, special in zip(encoding.offsets, encoding.special_tokens_mask, strict=True)
            if not special
        ]
        wrong = next(((s, e) for s, e in spans if not 0 <= s <= e <= len(text)), None)
        if wrong is not None:
            raise ExportError(
                f"{where}: offsets unsupported by the tokenizer: a token of {text!r} spans "
                f"characters {wrong}, outside its {len(text)}"
            )
        if text == OFFSET_PROBE:
            covered = {i for s, e in spans for i in range(s, e)}
            letters = [i for i, c in enumerate(text) if c.isalpha()]
            if not set(letters) <= covered:
                found = len(set(letters) & covered)
                raise ExportError(
                    f"{where}: offsets unsupported by the tokenizer: its tokens' character "
                    f"offsets in {text!r} cover {found} of its {len(letters)} letters, so no "
                    "entity could be placed in a text"
                )
