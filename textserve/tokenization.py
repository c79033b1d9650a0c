"""THE tokenization contract: one implementation for training, export checks, serving and the
benchmark's ceilings (docs/architecture.md, "Tokenization"; docs/models.md for foreign models).

    tokenization = Tokenization.for_manifest(tokenizer, manifest)
    batch = tokenization.arrays(["a gripping film", "dull"])      # int64 (B, T) each
    batch.input_ids, batch.attention_mask, batch.token_type_ids
    pairs = tokenization.arrays(["a man sleeps"], ["a person rests"])   # the pair template

The rules (contract format 2):
- the tokenizer file's own pipeline (normalizer, pre-tokenizer, model, post-processor) gives the
  ids, with its own special tokens ([CLS]/[SEP], <s>/</s>: never hard-coded here); padding and
  truncation baked into the file are removed at load (the server decides both);
- an over-long encoding is cut as the tokenizers library's truncation (`enable_truncation
  (max_length, strategy="longest_first", direction=truncation_side)`, transformers'
  `truncation=True`) cuts it: the content is cut, the special tokens stay, a pair loses tokens
  from its longer text first;
- an encoding with zero ids (no post-processor and a text that normalizes to nothing) becomes
  one `unk_token_id`; with none, it is refused (`Row.ids` empty, `TokenizationError` in arrays);
- rows are padded with `pad_token_id` to the longest in the batch; `attention_mask` is 1 on real
  tokens, 0 on padding; `token_type_ids` are the template's type ids, 0 on padding.
numpy and `tokenizers` only (no torch, no onnxruntime).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from textserve.artifact import TRUNCATION_SIDES, UNK_BY_NAME

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

    from textserve.artifact import Manifest

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
PAD_TOKEN_ID = 0  # our own runs' pad id (model/tokenizer.py); foreign ones: the manifest's


class TokenizationError(ValueError):
    """The tokenizer (or a call) breaks the contract: no [UNK] token, max_length < 1."""


class Row(NamedTuple):
    """One encoded text (or pair), cut to max_length."""

    ids: list[int]  # special tokens kept; [] for zero ids without an unk token (refused)
    type_ids: Sequence[int]  # the template's type ids, one per id (empty: not asked for)
    length: int  # tokens before truncation, special tokens included

    @property
    def truncated(self) -> bool:
        return self.length > len(self.ids)


class Batch(NamedTuple):
    """A padded batch: three int64 (B, T) arrays, T = the longest row."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizers file (tokenizer.json) as a Tokenizer."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def unk_id(tokenizer: Tokenizer) -> int:
    """The id of [UNK]: what a text with no tokens becomes (format 1's rule)."""
    idx = tokenizer.token_to_id(UNK_TOKEN)
    if idx is None:
        raise TokenizationError(
            f"the tokenizer has no {UNK_TOKEN} token: a text with no tokens could not be encoded"
        )
    return int(idx)


def pad(rows: Sequence[Sequence[int]], pad_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """input_ids and attention_mask, int64 (B, longest), from unpadded rows of ids.

    >>> ids, mask = pad([[5, 6, 7], [8]], 0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6, 7], [8, 0, 0]], [[1, 1, 1], [1, 0, 0]])
    """
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    width = int(lengths.max()) if len(rows) else 1
    real = lengths[:, None] > np.arange(width)  # (B, longest), True on real tokens
    ids = np.full(real.shape, pad_token_id, dtype=np.int64)
    # one copy for the whole batch: boolean assignment fills row by row, as chain() yields
    ids[real] = np.fromiter(itertools.chain.from_iterable(rows), np.int64, int(lengths.sum()))
    return ids, real.astype(np.int64)


def longest_first(first: int, second: int, budget: int) -> tuple[int, int]:
    """How many content tokens of a pair stay under `budget`: tokenizers' LongestFirst
    truncation (truncate_encodings in the tokenizers crate), the same numbers.

    >>> longest_first(3, 10, 8), longest_first(10, 10, 8), longest_first(10, 10, 7)
    ((3, 5), (4, 4), (3, 4))
    """
    if first + second <= budget:
        return first, second
    n1, n2 = (second, first) if first > second else (first, second)  # n1: the shorter
    n2 = n1 if n1 > budget else max(n1, budget - n1)
    if n1 + n2 > budget:
        n1 = budget // 2
        n2 = n1 + budget % 2
    return (n2, n1) if first > second else (n1, n2)


class Tokenization:
    """The contract bound to one tokenizer and model: what every path calls.

    >>> from tokenizers import Tokenizer, models, pre_tokenizers
    >>> tok = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "good": 2}, unk_token="[UNK]"))
    >>> tok.pre_tokenizer = pre_tokenizers.Whitespace()
    >>> Tokenization(tok, max_length=2).encode(["good good good", ""])
    [[2, 2], [1]]
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_length: int,
        pad_token_id: int = PAD_TOKEN_ID,
        *,
        unk_token_id: int | None = UNK_BY_NAME,
        truncation_side: str = "right",
    ) -> None:
        """`unk_token_id`: what a text with zero ids becomes (UNK_BY_NAME: the id of [UNK],
        TokenizationError without one; None: such a text is refused). The tokenizer's baked-in
        padding and truncation are removed (in place)."""
        if max_length < 1:
            raise TokenizationError(f"max_length must be >= 1, got {max_length}")
        if truncation_side not in TRUNCATION_SIDES:
            raise TokenizationError(
                f"truncation_side must be right or left, not {truncation_side!r}"
            )
        # A file saved after a padded call pads every text to its length with a mask of ones
        # over the pads (silently wrong scores); a baked-in truncation cuts before we do.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.pad_token_id = pad_token_id
        self.truncation_side = truncation_side
        if unk_token_id == UNK_BY_NAME:
            unk_token_id = unk_id(tokenizer)
        elif unk_token_id is not None and tokenizer.id_to_token(unk_token_id) is None:
            raise TokenizationError(
                f"unk_token_id {unk_token_id} is not in the tokenizer's vocabulary "
                f"({tokenizer.get_vocab_size()} tokens)"
            )
        self.unk_token_id = unk_token_id
        self._unk = [] if unk_token_id is None else [unk_token_id]
        self._specials = (
            tokenizer.num_special_tokens_to_add(False),
            tokenizer.num_special_tokens_to_add(True),
        )
        # Pairs mean something only if the tokenizer's pair template sets the two texts apart
        # with special tokens; without one ([PAD]/[UNK]-only tokenizers such as our runs') they
        # would run together as one text.
        self.takes_pairs = self._specials[1] > 0
        if max_length <= self._specials[0]:
            raise TokenizationError(
                f"max_length {max_length} leaves no room for a token beside the tokenizer's "
                f"{self._specials[0]} special tokens"
            )

    @classmethod
    def for_manifest(cls, tokenizer: Tokenizer, manifest: Manifest) -> Tokenization:
        """The tokenization a version's manifest prescribes (format 1 or 2)."""
        return cls(
            tokenizer,
            manifest.max_length,
            manifest.pad_token_id,
            unk_token_id=manifest.unk_token_id,
            truncation_side=manifest.truncation_side,
        )

    @property
    def unk_id(self) -> int:
        """An id every model takes, for probe and warm-up rows: the unk token's, else pad's."""
        return self.pad_token_id if self.unk_token_id is None else self.unk_token_id

    def rows(
        self, texts: Sequence[str], pairs: Sequence[str] | None = None, *, type_ids: bool = True
    ) -> list[Row]:
        """Each text (with its pair, when given) encoded and cut to max_length; `type_ids`
        False leaves Row.type_ids empty (a graph without the input: ~30% less time here)."""
        # encode_batch_fast: the same ids, type ids and sequence ids without character offsets,
        # which classification never reads (measured: a fifth less time per batch of short texts)
        if pairs is None:
            encodings = self.tokenizer.encode_batch_fast(list(texts))
        else:
            if len(pairs) != len(texts):
                raise TokenizationError(f"{len(pairs)} text pairs for {len(texts)} texts")
            if self.max_length < self._specials[1]:
                raise TokenizationError(
                    f"max_length {self.max_length} is shorter than the tokenizer's "
                    f"{self._specials[1]} special tokens of a pair"
                )
            encodings = self.tokenizer.encode_batch_fast(list(zip(texts, pairs, strict=True)))
        if type_ids:
            return [self._row(encoding, True) for encoding in encodings]
        limit, rows = self.max_length, []
        for encoding in encodings:  # the serving hot path of a graph without type ids
            ids = encoding.ids
            fits = 0 < len(ids) <= limit
            rows.append(Row(ids, (), len(ids)) if fits else self._row(encoding, False))
        return rows

    def _row(self, encoding: Encoding, type_ids: bool) -> Row:
        ids = encoding.ids
        length = len(ids)
        types: Sequence[int] = encoding.type_ids if type_ids else ()
        if length <= self.max_length:
            if not length:  # no post-processor and nothing left after normalization
                return Row(self._unk, [0] * len(self._unk) if type_ids else (), len(self._unk))
            return Row(ids, types, length)
        keep = self._kept(encoding)
        if keep is None:  # no special tokens: a plain cut
            cut = (
                slice(None, self.max_length)
                if self.truncation_side == "right"
                else slice(-self.max_length, None)
            )
            return Row(ids[cut], types[cut], length)
        kept_types = np.asarray(types)[keep].tolist() if type_ids else ()
        return Row(np.asarray(ids)[keep].tolist(), kept_types, length)

    def _kept(self, encoding: Encoding) -> np.ndarray | None:
        """Which positions of an over-long encoding stay (None: all but a plain cut), by the
        library's rule: its truncation cuts each sequence's content before the post-processor
        adds the special tokens, so that is what is cut here, the special tokens left alone.
        (Not the library itself: for a pair with both texts over the limit it builds every
        combination of overflowing pieces, and a long pair took gigabytes.)"""
        sequence = np.fromiter((-1 if s is None else s for s in encoding.sequence_ids), np.int64)
        specials = int((sequence < 0).sum())
        if not specials and sequence.max(initial=0) == 0:
            return None
        counts = [int((sequence == k).sum()) for k in (0, 1)]
        budget = self.max_length - specials
        stay = longest_first(counts[0], counts[1], budget)  # (budget, 0) for a single text
        keep = sequence < 0
        for k in (0, 1):
            mine = sequence == k
            rank = np.cumsum(mine) - 1  # position within sequence k
            if self.truncation_side == "right":
                keep |= mine & (rank < stay[k])
            else:
                keep |= mine & (rank >= counts[k] - stay[k])
        return keep

    def full_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Untruncated ids per text ([UNK] for a text with no tokens). Serving uses rows()."""
        unk = self._unk
        return [enc.ids or unk for enc in self.tokenizer.encode_batch(list(texts))]

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> list[list[int]]:
        """Unpadded ids per text, cut to max_length."""
        return [row.ids for row in self.rows(texts, pairs)]

    def pad(self, rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        return pad(rows, self.pad_token_id)

    def pad_rows(self, rows: Sequence[Row]) -> Batch:
        """The three arrays of encoded rows (with their type ids); TokenizationError for a row
        with no ids."""
        for index, row in enumerate(rows):
            if not row.ids:
                raise TokenizationError(
                    f"texts[{index}] has no tokens and the model has no unknown token for it"
                )
        input_ids, attention_mask = pad([row.ids for row in rows], self.pad_token_id)
        token_type_ids, _ = pad([row.type_ids for row in rows], 0)
        return Batch(input_ids, attention_mask, token_type_ids)

    def arrays(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> Batch:
        """input_ids, attention_mask, token_type_ids: int64 (B, T), T = the longest row."""
        return self.pad_rows(self.rows(texts, pairs))

    def batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """input_ids and attention_mask, int64 (B, T), T = the longest (cut) text."""
        batch = self.arrays(texts)
        return batch.input_ids, batch.attention_mask


def encode_ids(tokenizer: Tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Unpadded ids per text, cut to max_length ([UNK] for a text with no tokens)."""
    return Tokenization(tokenizer, max_length).encode(texts)


def encode_batch(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    max_length: int,
    pad_token_id: int = PAD_TOKEN_ID,
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and attention mask, both int64 (B, T) with T = the longest (cut) text."""
    return Tokenization(tokenizer, max_length, pad_token_id).batch(texts)
