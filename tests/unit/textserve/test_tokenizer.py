"""The tokenizer contract: [PAD]=0, [UNK], lower-casing, truncation/padding done by encode_batch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from textserve.model.tokenizer import train_tokenizer
from textserve.tokenization import PAD_TOKEN_ID, encode_batch, load_tokenizer, unk_id

TEXTS = ["A great film, truly great.", "A dull film.", "Great acting; dull plot!"] * 5


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_tokenizer(TEXTS, vocab_size=200, min_frequency=1)


def test_special_ids(tok: Tokenizer) -> None:
    assert tok.token_to_id("[PAD]") == PAD_TOKEN_ID == 0
    assert unk_id(tok) == 1


def test_lowercase_by_default(tok: Tokenizer) -> None:
    assert tok.encode("GREAT").ids == tok.encode("great").ids
    cased = train_tokenizer(TEXTS, vocab_size=200, lowercase=False, min_frequency=1)
    assert cased.encode("Great").ids != cased.encode("great").ids


def test_encode_batch_pads_truncates_and_masks(tok: Tokenizer) -> None:
    ids, mask = encode_batch(tok, ["great film", "a great film truly great", ""], max_length=4)
    assert ids.dtype == mask.dtype == np.int64
    assert ids.shape == (3, 4)  # longest after truncation
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert ids[0, 2:].tolist() == [0, 0]
    assert ids[2, 0] == unk_id(tok)  # a text with no tokens becomes one [UNK]
    assert (ids[mask == 0] == PAD_TOKEN_ID).all()


def test_unknown_words_map_to_unk(tok: Tokenizer) -> None:
    ids, _ = encode_batch(tok, ["zzzqqq"], max_length=8)
    assert unk_id(tok) in ids[0].tolist()


def test_saved_file_has_no_padding_or_truncation(tok: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    raw = json.loads(path.read_text())
    assert raw["padding"] is None and raw["truncation"] is None
    again = load_tokenizer(path)
    assert again.encode("a great film").ids == tok.encode("a great film").ids


def test_bad_arguments(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="max_length must be >= 1"):
        encode_batch(tok, ["x"], max_length=0)
    with pytest.raises(ValueError, match="vocab_size must be at least"):
        train_tokenizer(TEXTS, vocab_size=2)
