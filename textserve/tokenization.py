"""THE tokenization contract: one implementation for training, export checks, serving and the
benchmark's ceilings (docs/architecture.md, "Tokenization").

    tokenization = Tokenization(tokenizer, max_length=128, pad_token_id=0)
    input_ids, attention_mask = tokenization.batch(["a gripping film", "dull"])   # int64 (B, T)

The rules: the tokenizer file's own pipeline (normalizer, pre-tokenizer, post-processor) gives
the ids; a text with no tokens becomes one `[UNK]`; ids are cut to `max_length`; rows are
padded with `pad_token_id` to the longest in the batch; `attention_mask` is 1 on real tokens and
0 on padding. A tokenizer without `[UNK]` breaks the contract: `TokenizationError`, everywhere.
numpy and `tokenizers` only (no torch, no onnxruntime).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
PAD_TOKEN_ID = 0  # fixed by the contract; the model's padding_idx and the server rely on it


class TokenizationError(ValueError):
    """The tokenizer (or a call) breaks the contract: no [UNK] token, max_length < 1."""


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizers file (tokenizer.json) as a Tokenizer."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def unk_id(tokenizer: Tokenizer) -> int:
    """The id of [UNK]: what a text with no tokens becomes."""
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


class Tokenization:
    """The contract bound to one tokenizer and model: what every path calls.

    >>> from tokenizers import Tokenizer, models
    >>> tok = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "good": 2}, unk_token="[UNK]"))
    >>> Tokenization(tok, max_length=2).encode(["good good good", ""])
    [[2, 2], [1]]
    """

    def __init__(
        self, tokenizer: Tokenizer, max_length: int, pad_token_id: int = PAD_TOKEN_ID
    ) -> None:
        if max_length < 1:
            raise TokenizationError(f"max_length must be >= 1, got {max_length}")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.pad_token_id = pad_token_id
        self.unk_id = unk_id(tokenizer)
        self._unk = [self.unk_id]

    def full_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Untruncated ids per text ([UNK] for a text with no tokens): the caller truncates,
        or refuses a text over max_length (serving with truncate=false)."""
        unk = self._unk
        return [enc.ids or unk for enc in self.tokenizer.encode_batch(list(texts))]

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Unpadded ids per text, cut to max_length."""
        limit = self.max_length
        return [ids[:limit] for ids in self.full_ids(texts)]

    def pad(self, rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        return pad(rows, self.pad_token_id)

    def batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """input_ids and attention_mask, int64 (B, T), T = the longest (cut) text."""
        return self.pad(self.encode(texts))


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


def token_lengths(tokenizer: Tokenizer, texts: Sequence[str]) -> list[int]:
    """Untruncated token counts (at least 1: an empty text is one [UNK])."""
    return [max(1, len(enc.ids)) for enc in tokenizer.encode_batch(list(texts))]
