"""The classifier written for inference without padding: the form of the graph export publishes.

    >>> graph_model = PaddingFreeClassifier(run.model).eval()  # doctest: +SKIP
    >>> torch.onnx.export(graph_model, (input_ids, attention_mask), "model.onnx")  # doctest: +SKIP

TransformerClassifier.forward runs every layer on the padded (B, T) grid. With the server's
batches, padded to their longest text, half of that grid is padding (the default model's test
split at batch 32: 49% real tokens) and the position-wise layers (QKV and output projections,
feed-forward, LayerNorm: ~94% of the matmul FLOPs at T = 48) compute it for nothing. This
module gives the same logits from the same weights (it shares the model's modules) but runs
those layers on the N real tokens only, packed as one (1, N, C) sequence. Attention, which
mixes the tokens of one text, goes back to the (B, T) grid by a gather and out again by another.

Two more things keep onnxruntime on its fast paths; see `_attend`. Eval only: dropout is left out.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F

from model.classifier import EncoderBlock, MultiHeadSelfAttention, TransformerClassifier

# Padding keys enter the softmax at (row max - SOFTMAX_FLOOR), not at float32's minimum. Why:
# exp() of anything below -87.3 is subnormal or zero, and onnxruntime's vectorized exp produces
# those through subnormal intermediates, each costing a microcode assist: with half the keys
# padding, Softmax ran 5x slower (1.6 vs 0.3 ms at 32x4x48x48; 15% of a batch of 32).
# exp(-80) ~ 1.8e-35 is a normal float, so no assist. It changes nothing: a softmax row sums to
# >= 1 (its max contributes exp(0)), and even 64 such terms add < 1e-33, far below half an ulp
# of 1, so the real keys' weights are those of an exact mask; the padding keys' value rows are
# zeroed, so their ~1e-35 weights contribute exactly 0. A real key scoring more than 80 below
# its row's max gets weight ~1e-35 instead of a smaller one: an absolute change < 2e-35.
SOFTMAX_FLOOR = 80.0


class PaddingFreeClassifier(nn.Module):
    """`TransformerClassifier.forward` (eval mode), computing real tokens only.

    input_ids, attention_mask: (B, T) int64, any 0/1 pattern (left or right padding, rows with
    no real token) -> logits (B, num_labels) float32, equal to the model's within float rounding.
    """

    def __init__(self, model: TransformerClassifier) -> None:
        super().__init__()
        if not isinstance(model, TransformerClassifier):
            raise TypeError(
                f"PaddingFreeClassifier wraps a TransformerClassifier, got {type(model).__name__}"
            )
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m = self.model
        b, t = input_ids.shape
        c = m.config.d_model
        real = attention_mask != 0  # (B, T)
        # A row with no real token gets its first position computed, and attended to, so that
        # N >= 1 (the gathers below always have a row to read) and no softmax row is all
        # padding. Its logits are the head's bias, as the model's are (its pooled vector is 0).
        first = torch.arange(t, device=input_ids.device) == 0  # (T,)
        computed = real | (first.unsqueeze(0) & ~real.any(dim=1, keepdim=True))  # (B, T)
        flat = computed.reshape(-1)  # (B*T,)
        keep = torch.nonzero(flat).squeeze(1)  # (N,) grid positions that are computed
        # The packed row each grid position reads when going back to the grid: its own for a
        # computed token; for padding, the previous computed one. Padding rows are never used
        # (masked as keys, dropped by pooling as queries), so any finite value does.
        slot = (torch.cumsum(flat.to(torch.int64), dim=0) - 1).clamp(min=0)  # (B*T,)
        key = computed.unsqueeze(1).unsqueeze(2).to(m.tok_emb.weight.dtype)  # (B, 1, 1, T)
        key_bias = (1.0 - key) * torch.finfo(key.dtype).min  # 0 on real keys, min on padding

        # Embedded on the grid, then packed: fewer graph nodes than packing ids and positions
        # first (that matters at batch 1), for ~1% of a batch of 32.
        x = m.tok_emb(input_ids) * m.embed_scale + m.positions(t).unsqueeze(0)  # (B, T, C)
        x = x.reshape(1, b * t, c).index_select(1, keep)  # (1, N, C)
        for block in m.blocks:
            x = self._block(cast(EncoderBlock, block), x, keep, slot, key, key_bias, b, t)
        x = m.final_norm(x)
        x = x.index_select(1, slot).view(b, t, c)  # (B, T, C), padding rows hold junk
        # The model's masked mean, with its summation order: junk rows are multiplied by 0.
        mask = attention_mask.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        pooled = (x * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B, C)
        return m.head(pooled).float()  # (B, num_labels)

    @staticmethod
    def _block(
        block: EncoderBlock,
        x: torch.Tensor,
        keep: torch.Tensor,
        slot: torch.Tensor,
        key: torch.Tensor,
        key_bias: torch.Tensor,
        b: int,
        t: int,
    ) -> torch.Tensor:
        # EncoderBlock.forward with attention on the grid; everything else stays packed.
        if block.norm_first:
            x = x + _attend(block.attn, block.norm1(x), keep, slot, key, key_bias, b, t)
            return x + block.ff(block.norm2(x))
        x = block.norm1(x + _attend(block.attn, x, keep, slot, key, key_bias, b, t))
        return block.norm2(x + block.ff(x))


def _attend(
    attn: MultiHeadSelfAttention,
    x: torch.Tensor,
    keep: torch.Tensor,
    slot: torch.Tensor,
    key: torch.Tensor,
    key_bias: torch.Tensor,
    b: int,
    t: int,
) -> torch.Tensor:
    """MultiHeadSelfAttention.forward on packed tokens: (1, N, C) -> (1, N, C)."""
    h, d = attn.n_heads, attn.head_dim
    qkv = attn.qkv(x).index_select(1, slot).view(b, t, 3, h, d)  # on the grid
    # One transpose for q, k and v (the packed layout is [q | k | v], each head-major), not a
    # split and three: a pass less over (B, T, 3C) per layer.
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, D)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))  # (B, H, T, T)
    # An additive mask, not masked_fill: onnxruntime's Where with a (B, 1, 1, T) condition takes
    # 3-4x as long as this broadcast Add (1.05 vs 0.3 ms at 32x4x48x48). Then the floor (see
    # SOFTMAX_FLOOR), and zero values for padding keys: (B, H, T, D) is smaller than the
    # (B, H, T, T) weights once T > D.
    masked = scores + key_bias  # (B, H, T, T)
    floor = masked.amax(dim=-1, keepdim=True) - SOFTMAX_FLOOR  # (B, H, T, 1)
    weights = F.softmax(torch.maximum(masked, floor), dim=-1)  # (B, H, T, T)
    y = weights @ (v * key.transpose(-1, -2))  # (B, H, T, D)
    y = y.transpose(1, 2).reshape(1, b * t, h * d)  # (1, B*T, C)
    return attn.out(y.index_select(1, keep))  # (1, N, C)
