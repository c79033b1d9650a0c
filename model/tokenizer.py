"""A BPE tokenizer (Hugging Face `tokenizers`) trained on the training split, and batching.

No torch here: `encode_batch` returns numpy arrays, so the same rules can run anywhere.
The rules (see docs/architecture.md): ids truncated to `max_length`, padded with [PAD] (id 0) to
the longest in the batch, attention_mask 1 on real tokens; a text with no tokens becomes [UNK].
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
PAD_TOKEN_ID = 0  # fixed by the contract; the model's padding_idx and the server rely on it
SPECIAL_TOKENS = [PAD_TOKEN, UNK_TOKEN]  # order gives [PAD]=0, [UNK]=1


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, lowercase: bool = True, min_frequency: int = 2
) -> Tokenizer:
    """Train a BPE tokenizer; `[PAD]` is id 0, `[UNK]` id 1, no padding/truncation baked in.

    BPE without a continuing-subword prefix, because that is what trains reproducibly: the
    WordPiece trainer numbers its "##" tokens in hash-map order and breaks merge ties by id, so
    the same data gives a different vocabulary from run to run (huggingface/tokenizers#1794).

    >>> tok = train_tokenizer(["a good film", "a bad film"], vocab_size=100, min_frequency=1)
    >>> tok.token_to_id("[PAD]"), tok.token_to_id("[UNK]")
    (0, 1)
    """
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must be at least {len(SPECIAL_TOKENS) + 1}, got {vocab_size}")
    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    # BERT's normalizer: strips control characters, normalises whitespace and (optionally)
    # lower-cases; the pre-tokenizer splits on whitespace and punctuation.
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if tokenizer.token_to_id(PAD_TOKEN) != PAD_TOKEN_ID:  # guards the contract, cheap
        raise AssertionError("[PAD] must have id 0")
    return tokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def unk_id(tokenizer: Tokenizer) -> int:
    idx = tokenizer.token_to_id(UNK_TOKEN)
    if idx is None:
        raise ValueError(f"the tokenizer has no {UNK_TOKEN} token")
    return int(idx)


def encode_batch(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    max_length: int,
    pad_token_id: int = PAD_TOKEN_ID,
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and attention mask, both int64 (B, T) with T = the longest (truncated) text.

    >>> tok = train_tokenizer(["a good film", "a bad film"], vocab_size=100, min_frequency=1)
    >>> ids, mask = encode_batch(tok, ["a good film", ""], max_length=8)
    >>> ids.shape, mask.tolist()
    ((2, 3), [[1, 1, 1], [1, 0, 0]])
    """
    rows = encode_ids(tokenizer, texts, max_length)
    width = max((len(r) for r in rows), default=1)
    ids = np.full((len(rows), width), pad_token_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def encode_ids(tokenizer: Tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Unpadded ids per text: truncated to `max_length`, and [UNK] for a text with no tokens."""
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    unknown = unk_id(tokenizer)
    return [enc.ids[:max_length] or [unknown] for enc in tokenizer.encode_batch(list(texts))]


def token_lengths(tokenizer: Tokenizer, texts: Sequence[str]) -> list[int]:
    """Untruncated token counts (at least 1, as encode_batch gives an empty text one [UNK])."""
    return [max(1, len(enc.ids)) for enc in tokenizer.encode_batch(list(texts))]
