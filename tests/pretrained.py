"""Tiny random-weight Hugging Face encoder folders (save_pretrained), built locally for tests.

Nothing is downloaded: the configs are transformers' config classes at toy sizes and the
tokenizers are trained here on the texts given. `bert_folder` is a WordPiece BERT (no head: a
pretrained encoder as users have them), `roberta_folder` a byte-level BPE RoBERTa, and
`vit_folder` an image model, which has no sequence-classification head.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

ENCODER_SIZE = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}


def _fast(tokenizer: object, **special: str) -> object:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special)


def bert_folder(root: Path, texts: Sequence[str], seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(
        texts,
        trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials, show_progress=False),
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    config = BertConfig(
        vocab_size=tok.get_vocab_size(), max_position_embeddings=64, pad_token_id=0, **ENCODER_SIZE
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(root)
    fast = _fast(
        tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]",
    )  # fmt: skip
    fast.save_pretrained(root)  # type: ignore[attr-defined]
    return root


def roberta_folder(root: Path, texts: Sequence[str], seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import RobertaConfig, RobertaModel

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's ids: <s>=0, <pad>=1, </s>=2
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=specials, show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )  # fmt: skip
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    config = RobertaConfig(
        vocab_size=tok.get_vocab_size(), max_position_embeddings=66, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, type_vocab_size=1, **ENCODER_SIZE,
    )  # fmt: skip
    torch.manual_seed(seed)
    RobertaModel(config).save_pretrained(root)
    fast = _fast(
        tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        cls_token="<s>", sep_token="</s>", mask_token="<mask>",
    )  # fmt: skip
    fast.save_pretrained(root)  # type: ignore[attr-defined]
    return root


def vit_folder(root: Path) -> Path:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(image_size=8, patch_size=4, num_channels=1, **ENCODER_SIZE)
    ViTModel(config).save_pretrained(root)
    return root
