"""The Transformer encoder of "Attention Is All You Need" as a text classifier, from the ground up.

`forward(input_ids, attention_mask) -> logits` is written to export to ONNX with dynamic batch and
sequence axes: no Python branching on tensor shapes, every mask built with tensor operations.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

POSITIONAL_KINDS = ("sinusoidal", "learned")


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to rebuild a TransformerClassifier (stored in the run's config.json)."""

    vocab_size: int = 8000  # rows of the token embedding; >= the tokenizer's vocabulary
    num_labels: int = 2  # width of the logits, one per label in labels.json order
    max_length: int = 64  # longest input in tokens; longer input is truncated by the caller
    d_model: int = 128  # width of every token representation (d in the paper)
    n_heads: int = 4  # attention heads; must divide d_model
    n_layers: int = 2  # encoder blocks (N in the paper)
    d_ff: int = 512  # inner width of the position-wise feed-forward network (4·d by default)
    dropout: float = 0.1  # on embeddings, sub-layer outputs, feed-forward inner layer, head
    attention_dropout: float = 0.1  # on the attention weights
    norm_first: bool = False  # False: post-norm as in the paper; True: pre-norm (+ final norm)
    positional: str = "sinusoidal"  # "sinusoidal" (the paper's formula) or "learned"
    pad_token_id: int = 0  # id of [PAD]; its embedding row is kept at zero
    layer_norm_eps: float = 1e-5  # LayerNorm epsilon (torch's default, for parity with torch.nn)
    # A linear bag of token n-grams beside the encoder (model/bag.py fits it after the encoder):
    # logits = encoder_weight * encoder logits + bag logits. 0 buckets: no bag, the encoder alone.
    bag_buckets: int = 0  # hash buckets of the bag's token bigrams (its unigrams are the ids)
    encoder_weight: float = 1.0  # the encoder's logits' weight in the sum (with a bag)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "num_labels", "max_length", "d_model", "n_heads", "n_layers"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_labels < 2:
            raise ValueError(f"ModelConfig.num_labels must be >= 2, got {self.num_labels}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"ModelConfig.d_model ({self.d_model}) must be divisible by "
                f"n_heads ({self.n_heads})"
            )
        if self.d_ff < 1:
            raise ValueError(f"ModelConfig.d_ff must be >= 1, got {self.d_ff}")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= float(getattr(self, name)) < 1.0:
                raise ValueError(f"ModelConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.positional not in POSITIONAL_KINDS:
            raise ValueError(
                f"ModelConfig.positional must be one of {', '.join(POSITIONAL_KINDS)}, "
                f"got {self.positional!r}"
            )
        if self.bag_buckets < 0 or not self.encoder_weight > 0.0:
            raise ValueError(
                "ModelConfig.bag_buckets must be >= 0 and encoder_weight > 0, got "
                f"{self.bag_buckets} and {self.encoder_weight}"
            )
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"ModelConfig.pad_token_id must be in [0, vocab_size), got {self.pad_token_id}"
            )

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A named preset with some fields replaced: `ModelConfig.preset("tiny", num_labels=3)`."""
        try:
            base = PRESETS[name]
        except KeyError:
            raise ValueError(
                f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}"
            ) from None
        return replace(base, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s): {', '.join(unknown)}")
        return cls(**data)


PRESETS: dict[str, ModelConfig] = {
    # For tests: trains in seconds, still a real multi-head, multi-layer encoder.
    "tiny": ModelConfig(
        vocab_size=1000, max_length=64, d_model=32, n_heads=2, n_layers=2, d_ff=64, dropout=0.1
    ),
    # The CPU default, sized for the default data set (~10k short review snippets): a wider or
    # deeper encoder over-fits that much data and is slower without being more accurate.
    "small": ModelConfig(
        vocab_size=8000,
        max_length=64,  # snippets: median 18 words, 99th percentile 40
        d_model=128,
        n_heads=4,
        n_layers=2,
        d_ff=512,
        dropout=0.2,  # 0.1 over-fits after two epochs; 0.3 is no better
        attention_dropout=0.1,
        # The encoder alone trails a linear model of n-grams on ~10k snippets, and their errors
        # differ: the sum beats both (docs/training.md, ablation). 2^20 buckets: ~10% of unseen
        # bigrams share a bucket with a trained one; 0.5: the encoder's weight in the sum, as
        # the validation splits of seeds 0-2 chose it from 0.5 / 0.75 / 1 (not their tests).
        bag_buckets=1 << 20,
        encoder_weight=0.5,
    ),
    "base": ModelConfig(
        vocab_size=16000, max_length=128, d_model=256, n_heads=8, n_layers=4, d_ff=1024
    ),
}


# The bag's bigram hash: (previous id · BAG_HASH_MULTIPLIER + id) mod bag_buckets, in int64
# (ids < 2^24 keep the product below 2^63), so the graph computes it with Mul, Add and Mod.
BAG_HASH_MULTIPLIER = 1000003


def bag_features(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, vocab_size: int, buckets: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The bag's features of each text: (rows (B, 2T) int64, weights (B, 2T) float32).

    Position t gives its unigram (row = its id) and its bigram with the id before it (row =
    vocab_size + hash; before the text and on padding the id counts as 0). Each distinct row
    of a text weighs 1 in all (a repeated n-gram 1/count per occurrence) and padding weighs 0:
    a binary bag of n-grams, whatever the padding.
    """
    ids = input_ids * attention_mask  # (B, T), padding -> 0
    prev = F.pad(ids, (1, 0))[:, :-1]  # (B, T) the id one position back
    bigram = torch.remainder(prev * BAG_HASH_MULTIPLIER + ids, buckets) + vocab_size  # (B, T)
    rows = torch.cat([ids, bigram], dim=1)  # (B, 2T)
    real = torch.cat([attention_mask, attention_mask], dim=1).to(torch.float32)  # (B, 2T)
    same = (rows.unsqueeze(2) == rows.unsqueeze(1)).to(torch.float32)  # (B, 2T, 2T)
    count = (same * real.unsqueeze(1)).sum(dim=2).clamp(min=1.0)  # (B, 2T) real copies of row
    return rows, real / count


def sinusoidal_table(length: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    position = torch.arange(length, dtype=torch.float64).unsqueeze(1)  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d/2),)
    angle = position / torch.pow(10000.0, two_i / d_model)  # (L, ceil(d/2))
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.to(torch.float32)


class MultiHeadSelfAttention(nn.Module):
    """Scaled dot-product attention over h heads, with a key-padding mask.

    The packed q/k/v projection has the layout of torch.nn.MultiheadAttention.in_proj_weight, so
    weights can be copied across in either direction.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # x: (B, T, C); attention_mask: (B, T), 1 on real tokens, 0 on padding
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)  # each (B, T, C)
        q = q.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        v = v.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # (B, H, T, T)
        # Padding keys get the most negative finite value, not -inf: exp() makes them exactly 0
        # (so padding cannot change a real token's output) and a row can never become NaN.
        is_pad_key = (attention_mask == 0).unsqueeze(1).unsqueeze(2)  # (B, 1, 1, T)
        scores = scores.masked_fill(is_pad_key, torch.finfo(scores.dtype).min)
        weights = self.dropout(F.softmax(scores, dim=-1))  # (B, H, T, T)
        y = weights @ v  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(b, t, c)  # (B, T, C)
        return self.out(y)


class FeedForward(nn.Module):
    """Position-wise FFN(x) = W2 · dropout(GELU(W1 x + b1)) + b2."""

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(F.gelu(self.linear1(x))))  # (B, T, C)


class EncoderBlock(nn.Module):
    """Self-attention and feed-forward sub-layers, each with a residual connection and LayerNorm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm_first = cfg.norm_first
        self.attn = MultiHeadSelfAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout1 = nn.Dropout(cfg.dropout)
        self.dropout2 = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # x: (B, T, C). norm_first is fixed at construction, so this branch is not data-dependent.
        if self.norm_first:
            x = x + self.dropout1(self.attn(self.norm1(x), attention_mask))
            x = x + self.dropout2(self.ff(self.norm2(x)))
        else:
            x = self.norm1(x + self.dropout1(self.attn(x, attention_mask)))
            x = self.norm2(x + self.dropout2(self.ff(x)))
        return x  # (B, T, C)


class TransformerClassifier(nn.Module):
    """Embeddings + positional encoding → N encoder blocks → masked mean pooling → linear head,
    plus (bag_buckets > 0) a linear bag of token n-grams whose logits are added."""

    pos_table: torch.Tensor  # the sinusoidal buffer (registered only for positional="sinusoidal")
    # The bag's tables (registered only with bag_buckets > 0; model/bag.py fills them)
    bag_ngram: torch.Tensor  # (vocab_size + bag_buckets, K) weight of each unigram / bigram row
    bag_char: torch.Tensor  # (vocab_size, K) each token's character n-grams' weights, summed
    bag_char_norm: torch.Tensor  # (vocab_size,) squared norm of each token's character vector
    bag_bias: torch.Tensor  # (K,)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_scale = math.sqrt(cfg.d_model)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_token_id)
        self.pos_emb: nn.Parameter | None
        if cfg.positional == "learned":
            self.pos_emb = nn.Parameter(torch.zeros(cfg.max_length, cfg.d_model))
            nn.init.normal_(self.pos_emb, std=0.02)
        else:
            self.pos_emb = None
            # Not persistent: it is a pure function of the config, so it stays out of the weights.
            self.register_buffer(
                "pos_table", sinusoidal_table(cfg.max_length, cfg.d_model), persistent=False
            )
        self.emb_dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.n_layers))
        # Pre-norm leaves the residual stream un-normalised; the usual fix is one final norm.
        self.final_norm = (
            nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else nn.Identity()
        )
        self.head_dropout = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(cfg.d_model, cfg.num_labels)
        # Embeddings of variance 1/d: after the × √d scaling they match the unit-scale sinusoids.
        nn.init.normal_(self.tok_emb.weight, std=cfg.d_model**-0.5)
        with torch.no_grad():
            self.tok_emb.weight[cfg.pad_token_id].zero_()
        if cfg.bag_buckets:
            # Buffers, not parameters: fitted in closed form by model/bag.py, not by the
            # optimizer; zeros (no random draw: the encoder's initial weights stay the same).
            k = cfg.num_labels
            self.register_buffer("bag_ngram", torch.zeros(cfg.vocab_size + cfg.bag_buckets, k))
            self.register_buffer("bag_char", torch.zeros(cfg.vocab_size, k))
            self.register_buffer("bag_char_norm", torch.zeros(cfg.vocab_size))
            self.register_buffer("bag_bias", torch.zeros(k))

    def positions(self, length: int) -> torch.Tensor:
        """Positional encodings for the first `length` positions, (T, C)."""
        table = self.pos_emb if self.pos_emb is not None else self.pos_table
        return table[:length]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # input_ids, attention_mask: (B, T) int64; returns logits (B, num_labels) float32
        logits = self.encoder_logits(input_ids, attention_mask)  # (B, num_labels)
        return self.with_bag(logits, input_ids, attention_mask)

    def encoder_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The encoder's logits alone (B, num_labels), without the bag: what the optimizer fits."""
        x = self.tok_emb(input_ids) * self.embed_scale  # (B, T, C)
        x = x + self.positions(input_ids.shape[1]).unsqueeze(0)  # (B, T, C)
        x = self.emb_dropout(x)
        for block in self.blocks:
            x = block(x, attention_mask)  # (B, T, C)
        x = self.final_norm(x)
        # Masked mean: padding positions are zeroed and the sum is divided by the real length,
        # so the pooled vector does not depend on how much padding the batch needed.
        mask = attention_mask.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        pooled = (x * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B, C)
        return self.head(self.head_dropout(pooled)).float()  # (B, num_labels)

    def with_bag(
        self, logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """The encoder's logits (B, K) combined with the bag's: the model's output."""
        if not self.config.bag_buckets:
            return logits
        return self.config.encoder_weight * logits + self.bag_logits(input_ids, attention_mask)

    def bag_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The bag's logits (B, K): binary n-gram weights + character n-grams of the tokens.

        The character part is each token's (fixed) character n-gram vector summed over the
        text and divided by sqrt(sum of their squared norms): a tf-idf vector's L2
        normalisation without the cross terms, so it needs only per-token tables.
        """
        cfg = self.config
        rows, weights = bag_features(input_ids, attention_mask, cfg.vocab_size, cfg.bag_buckets)
        ngram = (F.embedding(rows, self.bag_ngram) * weights.unsqueeze(-1)).sum(dim=1)  # (B, K)
        real = attention_mask.to(torch.float32)  # (B, T)
        char = (F.embedding(input_ids, self.bag_char) * real.unsqueeze(-1)).sum(dim=1)  # (B, K)
        norm = (F.embedding(input_ids, self.bag_char_norm.unsqueeze(1)).squeeze(2) * real).sum(1)
        return ngram + char / (torch.sqrt(norm) + 1e-12).unsqueeze(1) + self.bag_bias

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
