"""Training a BPE tokenizer (Hugging Face `tokenizers`) on the training split.

Encoding is not here: every path (training, export checks, serving, the benchmark) encodes
through `textserve.tokenization`, the one implementation of the contract.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from textserve.tokenization import PAD_TOKEN, PAD_TOKEN_ID, UNK_TOKEN

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
