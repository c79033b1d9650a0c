"""Tokenization contract format 2 on foreign tokenizers, trained here (nothing downloaded):
WordPiece with BERT's template, byte-level BPE with RoBERTa's (<pad>=1, <unk>), Unigram with
XLM-R's and DeBERTa-v2's. Ids, masks and type ids equal transformers' (truncation=True,
max_length, padding=True) on texts far over max_length, empty-ish and odd Unicode ones, right
and left truncation, single texts and pairs; baked-in padding and truncation are removed."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from textserve.tokenization import Row, Tokenization, TokenizationError, load_tokenizer

CORPUS = [
    "a gripping film with a thin plot",
    "the acting was wooden, the score superb",
    "Un film étonnant, naïve et drôle",
    "東京の映画館で見た 😀 great",
    "nobody expected the ending; everyone loved it",
] * 4
WORDS = " ".join(CORPUS).split()
LONG = " ".join(WORDS * 30)  # hundreds of tokens: far over every max_length here
TEXTS = [
    LONG,
    "a gripping film",
    "",
    " ",
    "\u0000\u0001",  # control characters only
    "\u200b\ufeff",  # zero-width space, byte-order mark
    "e\u0301e\u0301 n\u0303",  # combining accents
    "👩‍👩‍👧 🏳️‍🌈",  # emoji ZWJ sequences
    "שלום עולם مرحبا",  # right-to-left scripts
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ",
    "[SEP] </s> [CLS] <s> typed by a user",
    "word " * 5,
]
# Pairs over the limit on both sides, not far over: for such a pair the library (and so
# transformers) builds every combination of overflowing pieces, and LONG with LONG took
# gigabytes (why textserve.tokenization cuts pairs itself, by the library's numbers).
MEDIUM = " ".join(WORDS[:45])
PAIRS = [MEDIUM, MEDIUM, "the plot", "", "x", LONG[:40], "ok", "a", "b", "c", "d", "e"]
PAIRED = [MEDIUM if text == LONG else text for text in TEXTS]


@dataclass(frozen=True)
class Style:
    """A tokenizer as a model family ships it, and how transformers is told its tokens."""

    name: str
    json: str  # tokenizer.json
    special: dict[str, str]  # transformers' pad_token, unk_token, ... names
    pad_id: int
    unk_id: int

    def ours(self, max_length: int, side: str = "right") -> Tokenization:
        tok = Tokenizer.from_str(self.json)
        return Tokenization(
            tok, max_length, self.pad_id, unk_token_id=self.unk_id, truncation_side=side
        )

    def theirs(self, side: str = "right") -> Any:
        transformers = pytest.importorskip("transformers")
        return transformers.PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_str(self.json), truncation_side=side, **self.special
        )


def _bert() -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    tok.train_from_iterator(
        CORPUS, trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials)
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tok


def _roberta() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>"],  # RoBERTa's order: <pad> is 1
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tok


def _unigram(template: str) -> Tokenizer:
    """SentencePiece-style Unigram: XLM-R's template (<s> A </s></s> B </s>) or DeBERTa-v2's
    ([CLS] A [SEP] B [SEP], type ids 0/1)."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    if template == "xlmr":
        specials = ["<s>", "<pad>", "</s>", "<unk>"]
    else:
        specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]
    trainer = trainers.UnigramTrainer(
        vocab_size=200, special_tokens=specials, unk_token=specials[3]
    )
    tok.train_from_iterator(CORPUS, trainer)
    ids = {t: tok.token_to_id(t) for t in specials}
    if template == "xlmr":
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>",
            pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", ids["<s>"]), ("</s>", ids["</s>"])],
        )
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
        )
    return tok


def _style(
    name: str, make: Callable[[], Tokenizer], pad: str, unk: str, cls: str, sep: str
) -> Style:
    tok = make()  # trained once: the trainers do not give the same vocabulary twice
    special = {"pad_token": pad, "unk_token": unk, "cls_token": cls, "sep_token": sep}
    return Style(name, tok.to_str(), special, tok.token_to_id(pad), tok.token_to_id(unk))


@pytest.fixture(scope="module")
def styles() -> dict[str, Style]:
    return {
        "bert": _style("bert", _bert, "[PAD]", "[UNK]", "[CLS]", "[SEP]"),
        "roberta": _style("roberta", _roberta, "<pad>", "<unk>", "<s>", "</s>"),
        "xlmr": _style("xlmr", lambda: _unigram("xlmr"), "<pad>", "<unk>", "<s>", "</s>"),
        "deberta": _style(
            "deberta", lambda: _unigram("deberta"), "[PAD]", "[UNK]", "[CLS]", "[SEP]"
        ),
    }


def _same_as_transformers(style: Style, max_length: int, side: str, pairs: bool) -> None:
    texts, second = (PAIRED, PAIRS) if pairs else (TEXTS, None)
    batch = style.ours(max_length, side).arrays(texts, second)
    theirs = style.theirs(side)(
        texts,
        second,
        truncation=True,
        max_length=max_length,
        padding=True,
        return_token_type_ids=True,
        return_tensors="np",
    )
    np.testing.assert_array_equal(batch.input_ids, theirs["input_ids"])
    np.testing.assert_array_equal(batch.attention_mask, theirs["attention_mask"])
    np.testing.assert_array_equal(batch.token_type_ids, theirs["token_type_ids"])
    assert batch.input_ids.dtype == batch.attention_mask.dtype == np.int64
    assert batch.token_type_ids.dtype == np.int64
    assert batch.input_ids.shape[1] == max_length  # the long text was cut, not dropped


@pytest.mark.parametrize("name", ["bert", "roberta", "xlmr", "deberta"])
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("pairs", [False, True], ids=["single", "pair"])
def test_ids_masks_and_type_ids_are_transformers(
    styles: dict[str, Style], name: str, side: str, pairs: bool
) -> None:
    for max_length in (16, 37):
        _same_as_transformers(styles[name], max_length, side, pairs)


def test_a_long_text_keeps_its_sep(styles: dict[str, Style]) -> None:
    # was: ids cut after the post-processor, so [SEP] was lost on every over-long text
    style = styles["bert"]
    sep, cls = (Tokenizer.from_str(style.json).token_to_id(t) for t in ("[SEP]", "[CLS]"))
    [row] = style.ours(16).rows([LONG])
    assert len(row.ids) == 16 and row.ids[0] == cls and row.ids[-1] == sep
    assert row.truncated and row.length > 100
    [left] = style.ours(16, "left").rows([LONG])
    assert left.ids[0] == cls and left.ids[-1] == sep and left.ids[1:-1] != row.ids[1:-1]
    [pair] = style.ours(16).rows([LONG], [LONG])
    assert pair.ids.count(sep) == 2 and pair.type_ids.count(1) == 8  # 7 tokens + [SEP] each


def test_roberta_style_pad_one_and_unk(styles: dict[str, Style]) -> None:
    style = styles["roberta"]
    assert (style.pad_id, style.unk_id) == (1, 3)
    ours = style.ours(32)
    batch = ours.arrays(["a gripping film", "a"])
    assert batch.input_ids[1, 0] == 0 and batch.input_ids[1, 2] == 2  # <s> a </s>
    assert (batch.input_ids[batch.attention_mask == 0] == 1).all()  # padded with <pad> = 1
    assert ours.unk_token_id == 3


def test_baked_in_padding_and_truncation_are_removed(
    styles: dict[str, Style], tmp_path: Path
) -> None:
    # a tokenizer.json saved after a call with padding="max_length": pads and a mask of ones
    tok = Tokenizer.from_str(styles["bert"].json)
    tok.enable_padding(length=48, pad_id=0, pad_token="[PAD]")
    tok.enable_truncation(max_length=5)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    assert json.loads(path.read_text())["padding"] is not None
    clean = styles["bert"].ours(16).arrays(["a gripping film", LONG])
    served = Tokenization(load_tokenizer(path), 16, 0, unk_token_id=1).arrays(
        ["a gripping film", LONG]
    )
    assert served.input_ids.shape == (2, 16)
    np.testing.assert_array_equal(served.input_ids, clean.input_ids)
    np.testing.assert_array_equal(served.attention_mask, clean.attention_mask)
    assert served.attention_mask[0].sum() < 16  # the short text's pads are masked


def test_zero_ids_become_unk_or_are_refused() -> None:
    tok = Tokenizer(models.WordLevel({"[PAD]": 0, "<unk>": 1, "good": 2}, unk_token="<unk>"))
    tok.normalizer = normalizers.BertNormalizer()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    assert Tokenization(tok, 4, unk_token_id=1).rows(["\u0000"]) == [Row([1], [0], 1)]
    refusing = Tokenization(tok, 4, unk_token_id=None)
    assert refusing.rows(["\u0000", "good"]) == [Row([], [], 0), Row([2], [0], 1)]
    with pytest.raises(TokenizationError, match=r"texts\[0\] has no tokens"):
        refusing.arrays(["\u0000", "good"])
    with pytest.raises(TokenizationError, match=r"has no \[UNK\] token"):
        Tokenization(tok, 4)  # format 1's rule: the id of "[UNK]"
    with pytest.raises(TokenizationError, match="unk_token_id 7 is not in the tokenizer"):
        Tokenization(tok, 4, unk_token_id=7)


def test_bad_settings_are_refused(styles: dict[str, Style]) -> None:
    tok = Tokenizer.from_str(styles["bert"].json)
    with pytest.raises(TokenizationError, match="no room for a token beside the tokenizer's 2"):
        Tokenization(tok, 2, unk_token_id=1)
    with pytest.raises(TokenizationError, match="truncation_side must be right or left"):
        Tokenization(tok, 8, unk_token_id=1, truncation_side="middle")
    with pytest.raises(TokenizationError, match="2 text pairs for 1 texts"):
        Tokenization(tok, 8, unk_token_id=1).rows(["a"], ["b", "c"])
    roberta = Tokenizer.from_str(styles["roberta"].json)  # <s> A </s></s> B </s>: 4
    with pytest.raises(TokenizationError, match="shorter than the tokenizer's 4 special tokens"):
        Tokenization(roberta, 3, 1, unk_token_id=3).rows(["a"], ["b"])
