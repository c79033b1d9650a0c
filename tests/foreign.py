"""Tiny Hugging Face sequence and token classifiers built here, as `save_pretrained` writes them.

Random weights from each architecture's config class (2 layers, hidden 32) and a tokenizer
trained on a few hundred synthetic texts: WordPiece for BERT-style models, byte-level BPE for
RoBERTa-style, Unigram (SentencePiece-like, with Metaspace) for DeBERTa-v2 and XLM-R. Nothing is
downloaded.

    folder = build("bert", tmp_path / "bert", num_labels=3)
    tagger = build_token("roberta", tmp_path / "ner")  # labels O, B-PER, I-PER, B-LOC, I-LOC
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from textserve.model.synthetic import synthetic_rows

ARCHITECTURES = (
    "bert",
    "distilbert",
    "roberta",
    "xlm-roberta",
    "deberta-v2",
    "modernbert",
    "electra",
)
MAX_LENGTH = 64  # the tiny models' length limit (max_position_embeddings less any offset)
VOCAB = 300


def corpus() -> list[str]:
    return [r["text"] for r in synthetic_rows(400, seed=3)] + ["Ünïcödé naïve café — 北京 🙂"]


def _wordpiece(lowercase: bool = True) -> tuple[Tokenizer, dict[str, str]]:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        corpus(),
        trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False),
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    names = {
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "mask_token": "[MASK]",
    }
    return tok, names


def _byte_bpe() -> tuple[Tokenizer, dict[str, str]]:
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's ids: pad 1
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus(),
        trainers.BpeTrainer(
            vocab_size=VOCAB,
            special_tokens=specials,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    # offsets as transformers' RobertaTokenizerFast sets them (add_prefix_space False, its
    # default): trimmed of the spaces a "Ġ" token carries, so an entity starts at its letter
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False
    )
    names = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "cls_token": "<s>",
        "sep_token": "</s>",
        "mask_token": "<mask>",
    }
    return tok, names


def _unigram(style: str) -> tuple[Tokenizer, dict[str, str]]:
    if style == "xlm-roberta":  # <s>=0 <pad>=1 </s>=2 <unk>=3, as XLM-R's sentencepiece
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        cls, sep, pad, unk, mask = "<s>", "</s>", "<pad>", "<unk>", "<mask>"
    else:  # DeBERTa-v2: [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3
        specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
        cls, sep, pad, unk, mask = "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        corpus(),
        trainers.UnigramTrainer(
            vocab_size=VOCAB, special_tokens=specials, unk_token=unk, show_progress=False
        ),
    )
    ids = {t: tok.token_to_id(t) for t in (cls, sep)}
    if style == "xlm-roberta":
        pair = f"{cls} $A {sep} {sep} $B {sep}"
    else:
        pair = f"{cls} $A {sep} $B:1 {sep}:1"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=pair, special_tokens=list(ids.items())
    )
    names = {
        "pad_token": pad,
        "unk_token": unk,
        "cls_token": cls,
        "sep_token": sep,
        "mask_token": mask,
    }
    if style == "xlm-roberta":
        names |= {"bos_token": cls, "eos_token": sep}
    return tok, names


_SMALL = {
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
}


def _config(arch: str, tok: Tokenizer, names: dict[str, str], **kw: Any) -> Any:
    import transformers as tf

    vocab = tok.get_vocab_size()
    pad = tok.token_to_id(names["pad_token"])
    if arch == "bert":
        return tf.BertConfig(
            vocab_size=vocab, max_position_embeddings=MAX_LENGTH, pad_token_id=pad, **_SMALL, **kw
        )
    if arch == "electra":
        return tf.ElectraConfig(
            vocab_size=vocab,
            max_position_embeddings=MAX_LENGTH,
            embedding_size=16,
            pad_token_id=pad,
            **_SMALL,
            **kw,
        )
    if arch == "distilbert":
        return tf.DistilBertConfig(
            vocab_size=vocab,
            max_position_embeddings=MAX_LENGTH,
            n_layers=2,
            n_heads=2,
            dim=32,
            hidden_dim=64,
            pad_token_id=pad,
            **kw,
        )
    if arch in ("roberta", "xlm-roberta"):
        cls = tf.RobertaConfig if arch == "roberta" else tf.XLMRobertaConfig
        # RoBERTa's positions start after the pad id: max_position_embeddings = limit + pad + 1
        return cls(
            vocab_size=vocab,
            max_position_embeddings=MAX_LENGTH + pad + 1,
            pad_token_id=pad,
            bos_token_id=0,
            eos_token_id=2,
            type_vocab_size=1,
            **_SMALL,
            **kw,
        )
    if arch == "deberta-v2":
        return tf.DebertaV2Config(
            vocab_size=vocab,
            max_position_embeddings=MAX_LENGTH,
            pad_token_id=pad,
            relative_attention=True,
            position_buckets=16,
            max_relative_positions=MAX_LENGTH,
            pos_att_type=["p2c", "c2p"],
            position_biased_input=False,
            type_vocab_size=0,
            **_SMALL,
            **kw,
        )
    if arch == "modernbert":
        return tf.ModernBertConfig(
            vocab_size=vocab,
            max_position_embeddings=MAX_LENGTH,
            pad_token_id=pad,
            cls_token_id=tok.token_to_id("[CLS]"),
            sep_token_id=tok.token_to_id("[SEP]"),
            bos_token_id=tok.token_to_id("[CLS]"),
            eos_token_id=tok.token_to_id("[SEP]"),
            global_attn_every_n_layers=2,
            local_attention=16,
            **_SMALL,
            **kw,
        )
    raise ValueError(arch)


_TOKENIZERS: dict[str, Callable[[], tuple[Tokenizer, dict[str, str]]]] = {
    "bert": _wordpiece,
    "electra": _wordpiece,
    "distilbert": _wordpiece,
    "modernbert": _wordpiece,
    "roberta": _byte_bpe,
    "xlm-roberta": lambda: _unigram("xlm-roberta"),
    "deberta-v2": lambda: _unigram("deberta-v2"),
}


def build(
    arch: str,
    folder: Path,
    *,
    num_labels: int = 3,
    seed: int = 0,
    tokenizer: tuple[Tokenizer, dict[str, str]] | None = None,
    **config: Any,
) -> Path:
    """save_pretrained of a tiny random-weight `arch` sequence classifier and its tokenizer."""
    auto = "AutoModelForSequenceClassification"
    return _save(arch, folder, auto, seed, tokenizer, num_labels=num_labels, **config)


# a token classifier's labels: people and places in BIO (IOB2)
TOKEN_LABELS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")


def build_token(
    arch: str,
    folder: Path,
    *,
    labels: Sequence[str] = TOKEN_LABELS,
    seed: int = 0,
    tokenizer: tuple[Tokenizer, dict[str, str]] | None = None,
    **config: Any,
) -> Path:
    """save_pretrained of a tiny random-weight `arch` token classifier (…ForTokenClassification,
    id2label from `labels`) and its tokenizer: what transformers' token-classification pipeline
    and `textserve export` take.

        folder = build_token("xlm-roberta", tmp_path / "pii", labels=("O", "EMAIL", "PHONE"))
    """
    config.setdefault("id2label", dict(enumerate(labels)))
    config.setdefault("label2id", {label: i for i, label in enumerate(labels)})
    return _save(arch, folder, "AutoModelForTokenClassification", seed, tokenizer, **config)


def _center_labels(model: Any, tok: Tokenizer) -> None:
    """Set a token classifier's bias to minus each label's mean logit over the corpus's tokens.

    Random encoders give every token much the same hidden state, so one label would win on
    almost every token (all "O": no entity to group); centred, each label wins somewhere."""
    import torch

    rows = [e.ids[:MAX_LENGTH] for e in tok.encode_batch(corpus()[:64])]
    width, pad = max(map(len, rows)), model.config.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[mask.bool()]
        model.classifier.bias -= logits.mean(dim=0)


def _save(
    arch: str,
    folder: Path,
    auto: str,
    seed: int,
    tokenizer: tuple[Tokenizer, dict[str, str]] | None,
    **config: Any,
) -> Path:
    """save_pretrained of a tiny random `arch` model (transformers' `auto` class) and tokenizer."""
    import torch
    import transformers as tf

    tok, names = tokenizer or _TOKENIZERS[arch]()
    # initializer_range well above the default 0.02: logits of a few units, not of 1e-3, so a
    # 1e-4 parity bound means something on random weights
    config.setdefault("initializer_range", 0.3)
    cfg = _config(arch, tok, names, **config)
    torch.manual_seed(seed)
    model = getattr(tf, auto).from_config(cfg).eval()
    if auto == "AutoModelForTokenClassification":
        _center_labels(model, tok)
    model.save_pretrained(folder)
    input_names = ["input_ids", "attention_mask"]
    if getattr(cfg, "type_vocab_size", 0) > 1:
        input_names.insert(1, "token_type_ids")
    fast = tf.PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=MAX_LENGTH, model_input_names=input_names, **names
    )
    fast.save_pretrained(folder)
    return folder


def tokenizer_for(arch: str) -> tuple[Tokenizer, dict[str, str]]:
    """The trained tokenizer `build` gives `arch` (train once, pass to several builds)."""
    return _TOKENIZERS[arch]()


LABELS = ["negative", "neutral", "positive"]


def classifier_and_reranker(root: Path) -> dict[str, Path]:
    """A 3-label BERT classifier (LABELS) and a one-output BERT cross-encoder, one tokenizer."""
    wordpiece = tokenizer_for("bert")
    return {
        "classifier": build(
            "bert",
            root / "classifier",
            tokenizer=wordpiece,
            id2label=dict(enumerate(LABELS)),
            label2id={label: i for i, label in enumerate(LABELS)},
        ),
        "reranker": build("bert", root / "reranker", tokenizer=wordpiece, num_labels=1),
    }


def export_all(folders: dict[str, Path], repository: Path) -> Path:
    """`textserve export` of each folder under its name into `repository`."""
    from textserve import cli

    for name, folder in folders.items():
        argv = ["export", str(folder), "--repository", str(repository), "--name", name]
        assert cli.main([*argv, "--threads", "1"]) == 0, name
    return repository


# Decoder sequence classifiers (issue #40): Qwen2, Qwen3, Llama and Gemma, each with its own
# transformers tokenizer class built from a vocabulary trained here, as their checkpoints ship
# (tokenizer_config.json names the class, which rebuilds its pipeline around tokenizer.json's
# vocabulary): Qwen's byte-level BPE (no BOS, no post-processor; its <|endoftext|> is eos,
# unk and pad), Llama's SentencePiece-style BPE with byte fallback (adds <s>, has no pad token)
# and Gemma's (adds <bos>, pads with <pad>).
#
#     folder = build_decoder("llama", tmp_path / "llama", num_labels=3)
DECODER_ARCHITECTURES = ("qwen2", "qwen3", "llama", "gemma")
DECODER_POSITIONS = 128  # max_position_embeddings (rotary: no offset), so max_length 128
_BYTES = [f"<0x{i:02X}>" for i in range(256)]  # byte-fallback pieces: any character encodes


def _bpe_parts(tok: Tokenizer) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A trained BPE's vocabulary and merges, as transformers' tokenizer classes take them."""
    import json

    model = json.loads(tok.to_str())["model"]
    return model["vocab"], [tuple(m) for m in model["merges"]]


def _qwen_tokenizer() -> Any:
    import transformers as tf

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        corpus(),
        trainers.BpeTrainer(
            vocab_size=VOCAB,
            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    vocab, merges = _bpe_parts(tok)
    return tf.Qwen2Tokenizer(vocab=vocab, merges=merges)


def _sentencepiece_bpe(style: str) -> Any:
    """Llama's or Gemma's tokenizer: BPE over "▁"-joined text, bytes for unseen characters."""
    import transformers as tf

    tok = Tokenizer(models.BPE(byte_fallback=True, fuse_unk=True))
    if style == "llama":  # <unk>=0 <s>=1 </s>=2
        specials = ["<unk>", "<s>", "</s>"]
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    else:  # Gemma: <pad>=0 <eos>=1 <bos>=2 <unk>=3
        specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
        tok.normalizer = normalizers.Replace(" ", "▁")
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB + len(_BYTES), special_tokens=specials + _BYTES, show_progress=False
    )
    tok.train_from_iterator(corpus(), trainer)
    vocab, merges = _bpe_parts(tok)
    cls = tf.LlamaTokenizer if style == "llama" else tf.GemmaTokenizer
    return cls(vocab=vocab, merges=merges, add_bos_token=True)


def decoder_tokenizer(arch: str) -> Any:
    """The transformers tokenizer `build_decoder` gives `arch` (train once, pass to several)."""
    return _qwen_tokenizer() if arch.startswith("qwen") else _sentencepiece_bpe(arch)


def _decoder_config(arch: str, tokenizer: Any, **kw: Any) -> Any:
    import transformers as tf

    shape = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # grouped-query attention, as the real ones
        "max_position_embeddings": DECODER_POSITIONS,
    }
    ids = {
        # Qwen2's config names its pad (the tokenizer's <|endoftext|>); Qwen3's names none,
        # its tokenizer does; Llama has a pad in neither (the export decides: its eos)
        "qwen2": {"pad_token_id": tokenizer.pad_token_id},
        "qwen3": {"head_dim": 8},
        "llama": {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id},
        "gemma": {
            "head_dim": 8,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        },
    }[arch]
    classes = {
        "qwen2": tf.Qwen2Config,
        "qwen3": tf.Qwen3Config,
        "llama": tf.LlamaConfig,
        "gemma": tf.GemmaConfig,
    }
    return classes[arch](**{**shape, **ids, **kw})


def build_decoder(
    arch: str,
    folder: Path,
    *,
    num_labels: int = 3,
    seed: int = 0,
    tokenizer: Any = None,
    **config: Any,
) -> Path:
    """save_pretrained of a tiny random-weight decoder sequence classifier (`arch` one of
    DECODER_ARCHITECTURES) and its tokenizer; `config` overrides the config's fields."""
    import torch
    import transformers as tf

    tok = tokenizer if tokenizer is not None else decoder_tokenizer(arch)
    config.setdefault("initializer_range", 0.3)  # logits of a few units (see build)
    cfg = _decoder_config(arch, tok, num_labels=num_labels, **config)
    torch.manual_seed(seed)
    model = tf.AutoModelForSequenceClassification.from_config(cfg).eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
