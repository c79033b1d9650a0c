"""The classifier written for inference without padding: the form of the graph export publishes.

    >>> graph_model = PaddingFreeClassifier(run.model).eval()  # doctest: +SKIP
    >>> torch.onnx.export(graph_model, (input_ids, attention_mask), "model.onnx")  # doctest: +SKIP

TransformerClassifier.forward runs every layer on the padded (B, T) grid. With the server's
batches, padded to their longest text, half of that grid is padding (the default model's test
split at batch 32: 49% real tokens) and the position-wise layers (QKV and output projections,
feed-forward, LayerNorm: ~94% of the matmul FLOPs at T = 48) compute it for nothing. This
module gives the same logits from the same weights (it shares the model's modules) but runs
those layers on the N real tokens only, packed as one (1, N, C) sequence. Attention, which
mixes the tokens of one text, runs on the (B, H, T, D) grid: q, k and v are gathered there
straight from the packed projection's rows of D values, and the result is gathered straight
back into packed tokens (no split, no transposes: measured 1.15x the fp32 graph that gathered
(B, T, 3C), split and transposed, and 1.37x vs 1.13x for int8 over fp32, at batch 32).

Two more things keep onnxruntime on its fast paths; see `_attend`. Eval only: dropout is left out.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, cast

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
        arange = functools.partial(torch.arange, device=input_ids.device)
        # A row with no real token gets its first position computed, and attended to, so that
        # N >= 1 (the gathers below always have a row to read) and no softmax row is all
        # padding. Its logits are the head's bias, as the model's are (its pooled vector is 0).
        first = arange(t) == 0  # (T,)
        computed = real | (first.unsqueeze(0) & ~real.any(dim=1, keepdim=True))  # (B, T)
        flat = computed.reshape(-1)  # (B*T,)
        keep = torch.nonzero(flat).squeeze(1)  # (N,) grid positions that are computed
        # The packed row each grid position reads when going back to the grid: its own for a
        # computed token; for padding, the previous computed one. Padding rows are never used
        # (masked as keys, dropped by pooling as queries), so any finite value does.
        slot = (torch.cumsum(flat.to(torch.int64), dim=0) - 1).clamp(min=0)  # (B*T,)
        key = computed.unsqueeze(1).unsqueeze(2).to(m.tok_emb.weight.dtype)  # (B, 1, 1, T)
        key_bias = (1.0 - key) * torch.finfo(key.dtype).min  # 0 on real keys, min on padding
        # Row numbers for attention (the same for every layer). A QKV projection of the packed
        # tokens, seen as rows of D values, holds token n's q for head j at row n*3H + j, its k
        # at n*3H + H + j and its v at n*3H + 2H + j (the layout MultiHeadSelfAttention's
        # view(..., 3, H, D) reads). `grid`: for each (b, j, t), that row of the token at grid
        # position (b, t) (slot: padding reads a real token, masked as a key). `back`: for each
        # packed token and head, its row in the (B, H, T, D) attention output.
        h = m.config.n_heads
        heads = arange(h)
        grid = (slot.view(b, 1, t) * (3 * h) + heads.view(1, h, 1)).reshape(-1)  # (B*H*T,)
        back = arange(b).view(b, 1, 1) * (h * t) + heads.view(1, 1, h) * t + arange(t).view(1, t, 1)
        # (N, H), built without // or %, which the dynamo exporter cannot convert here
        back = back.reshape(b * t, h).index_select(0, keep).reshape(-1)  # (N*H,)
        rows = _Rows(grid, back, key, key_bias, b, t)

        # Embedded on the grid, then packed: fewer graph nodes than packing ids and positions
        # first (that matters at batch 1), for ~1% of a batch of 32.
        x = m.tok_emb(input_ids) * m.embed_scale + m.positions(t).unsqueeze(0)  # (B, T, C)
        x = x.reshape(1, b * t, c).index_select(1, keep)  # (1, N, C)
        for block in m.blocks:
            x = self._block(cast(EncoderBlock, block), x, rows)
        x = m.final_norm(x)
        x = x.index_select(1, slot).view(b, t, c)  # (B, T, C), padding rows hold junk
        # The model's masked mean, with its summation order: junk rows are multiplied by 0.
        mask = attention_mask.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        pooled = (x * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B, C)
        return m.head(pooled).float()  # (B, num_labels)

    @staticmethod
    def _block(block: EncoderBlock, x: torch.Tensor, rows: _Rows) -> torch.Tensor:
        # EncoderBlock.forward with attention on the grid; everything else stays packed.
        if block.norm_first:
            x = x + _attend(block.attn, block.norm1(x), rows)
            return x + block.ff(block.norm2(x))
        x = block.norm1(x + _attend(block.attn, x, rows))
        return block.norm2(x + block.ff(x))


class _Rows(NamedTuple):
    """What attention needs to go from packed tokens to the grid and back (see forward)."""

    grid: torch.Tensor  # (B*H*T,) q rows of the packed QKV rows; k: + H, v: + 2H
    back: torch.Tensor  # (N*H,) rows of the (B*H*T, D) attention output, packed order
    key: torch.Tensor  # (B, 1, 1, T) 1.0 on keys that are attended to
    key_bias: torch.Tensor  # (B, 1, 1, T) 0 on those keys, float32's minimum on padding
    b: int
    t: int


def _attend(attn: MultiHeadSelfAttention, x: torch.Tensor, rows: _Rows) -> torch.Tensor:
    """MultiHeadSelfAttention.forward on packed tokens: (1, N, C) -> (1, N, C)."""
    h, d, b, t = attn.n_heads, attn.head_dim, rows.b, rows.t
    qkv = attn.qkv(x).reshape(-1, d)  # (N*3H, D)
    q = qkv.index_select(0, rows.grid).view(b, h, t, d)
    k = qkv.index_select(0, rows.grid + h).view(b, h, t, d)
    v = qkv.index_select(0, rows.grid + 2 * h).view(b, h, t, d)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))  # (B, H, T, T)
    # An additive mask, not masked_fill: onnxruntime's Where with a (B, 1, 1, T) condition takes
    # 3-4x as long as this broadcast Add (1.05 vs 0.3 ms at 32x4x48x48). Then the floor (see
    # SOFTMAX_FLOOR), and zero values for padding keys: (B, H, T, D) is smaller than the
    # (B, H, T, T) weights once T > D.
    masked = scores + rows.key_bias  # (B, H, T, T)
    floor = masked.amax(dim=-1, keepdim=True) - SOFTMAX_FLOOR  # (B, H, T, 1)
    weights = F.softmax(torch.maximum(masked, floor), dim=-1)  # (B, H, T, T)
    y = weights @ (v * rows.key.transpose(-1, -2))  # (B, H, T, D)
    y = y.reshape(-1, d).index_select(0, rows.back).view(1, -1, h * d)  # (1, N, C)
    return attn.out(y)
