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
(B, T, 3C), split and transposed, at batch 32).

Padding keys are copies of real keys of their row, scored PADDING_PENALTY lower (see `_attend`).
Eval only: dropout is left out.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, cast

import torch
from torch import nn
from torch.nn import functional as F

from textserve.model.classifier import EncoderBlock, MultiHeadSelfAttention, TransformerClassifier

# What a padding key's attention score loses against the real key it copies (see _attend).
PADDING_PENALTY = 30.0


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
        # N >= 1 (the gathers below always have a row to read) and every softmax row has a key
        # to divide by. Its logits are the head's bias, as the model's are (its pooled vector
        # is 0).
        first = arange(t) == 0  # (T,)
        computed = real | (first.unsqueeze(0) & ~real.any(dim=1, keepdim=True))  # (B, T)
        flat = computed.reshape(-1)  # (B*T,)
        keep = torch.nonzero(flat).squeeze(1)  # (N,) grid positions that are computed
        # The packed row each grid position reads: its own for a computed token; for padding, a
        # computed token of the same row (the previous one, or for left padding the row's first:
        # rows_before counts the computed tokens of the rows above). Padding rows are never used
        # as queries (pooling drops them); as keys they copy a key of their row (see _attend).
        slot = torch.cumsum(flat.to(torch.int64), dim=0) - 1  # (B*T,)
        counts = computed.sum(dim=1, dtype=torch.int64)  # (B,)
        rows_before = torch.cumsum(counts, dim=0) - counts  # (B,)
        slot = torch.maximum(slot.view(b, t), rows_before.unsqueeze(1)).reshape(-1)  # (B*T,)
        # Row numbers for attention (the same for every layer). A QKV projection of the packed
        # tokens, seen as rows of D values, holds token n's q for head j at row n*3H + j and its
        # k at n*3H + H + j (the layout MultiHeadSelfAttention's view(..., 3, H, D) reads).
        # `grid`: for each (b, j, t), the q row of the token at grid position (b, t) (+ H: its
        # k row, + 2H: its v row). `back`: for each packed token and head, its row in the
        # (B, H, T, D) attention output.
        h = m.config.n_heads
        heads = arange(h)
        grid = slot.view(b, 1, t) * (3 * h) + heads.view(1, h, 1)  # (B, H, T)
        back = arange(b).view(b, 1, 1) * (h * t) + heads.view(1, 1, h) * t + arange(t).view(1, t, 1)
        # (N, H), built without // or %, which the dynamo exporter cannot convert here
        back = back.reshape(b * t, h).index_select(0, keep).reshape(-1)  # (N*H,)
        penalty = (~computed).to(m.tok_emb.weight.dtype) * -PADDING_PENALTY  # (B, T)
        # Expanded over the query axis once: onnxruntime adds a (B, 1, 1, T) operand to the
        # (B, H, T, T) scores one T-long span at a time, 1.5x slower than (B, 1, T, T)'s T*T
        # spans (0.375 vs 0.25 ms a layer at batch 32; (B, H, T, T) was no faster).
        penalty = penalty.view(b, 1, 1, t).expand(b, 1, t, t)
        rows = _Rows(grid.reshape(-1), penalty, back, b, t)

        # Embedded on the grid, then packed: fewer graph nodes than packing ids and positions
        # first (that matters at batch 1), for ~1% of a batch of 32. The table is scaled once
        # (the exporter folds it into a constant): the same products as scaling after the lookup.
        table = m.tok_emb.weight * m.embed_scale  # (V, C)
        x = F.embedding(input_ids, table) + m.positions(t).unsqueeze(0)  # (B, T, C)
        x = x.reshape(1, b * t, c).index_select(1, keep)  # (1, N, C)
        for block in m.blocks:
            x = self._block(cast(EncoderBlock, block), x, rows)
        x = m.final_norm(x)
        x = x.index_select(1, slot).view(b, t, c)  # (B, T, C), padding rows hold junk
        # The model's masked mean, with its summation order: junk rows are multiplied by 0.
        mask = attention_mask.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        pooled = (x * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B, C)
        return m.with_bag(m.head(pooled).float(), input_ids, attention_mask)  # (B, K)

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
    penalty: torch.Tensor  # (B, 1, T, T) added to scores: 0 on real keys, -PADDING_PENALTY
    back: torch.Tensor  # (N*H,) rows of the (B*H*T, D) attention output, packed order
    b: int
    t: int


def _attend(attn: MultiHeadSelfAttention, x: torch.Tensor, rows: _Rows) -> torch.Tensor:
    """MultiHeadSelfAttention.forward on packed tokens: (1, N, C) -> (1, N, C).

    Padding keys are not masked out, they are outweighed: each is a copy of a real key r of its
    row (forward's `slot`) scored PADDING_PENALTY lower, so its softmax weight is e^-30 ~
    9.4e-14 times r's. With n padding keys, the real keys' share of the weights and of
    the output moves by at most n * 9.4e-14 relative (6e-12 at 64 keys, 4.8e-11 at 512): far
    below float32's resolution (6e-8), so the result is the masked attention's, to rounding.
    And since a padding score is never more than 30 below a real one, exp() stays a normal
    float (it needs a real key scoring 57 below its row's max to go subnormal).

    Why not mask: with float32's minimum added to padding scores, onnxruntime's vectorized
    exp() goes through subnormal intermediates on them, each a microcode assist (Softmax ran
    5x slower with half the keys padding). Two exact alternatives were measured, interleaved on
    the test split (1 thread, onnxruntime 1.32): a softmax floor (ReduceMax, Sub, Max on the
    (B, H, T, T) scores, and zeroed padding values): this is 1.15x faster for fp32 and 1.19x
    for int8 at batch 32, the same to 1.13x at batch 1 (two runs); zero padding values with a
    D+1-th value column of ones to divide by: this is 1.08x faster for both at batch 32,
    1.01x / 1.10x at batch 1.
    """
    h, d, b, t = attn.n_heads, attn.head_dim, rows.b, rows.t
    qkv = attn.qkv(x).reshape(-1, d)  # (N*3H, D)
    q = qkv.index_select(0, rows.grid).view(b, h, t, d)
    k = qkv.index_select(0, rows.grid + h).view(b, h, t, d)
    v = qkv.index_select(0, rows.grid + 2 * h).view(b, h, t, d)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d)) + rows.penalty  # (B, H, T, T)
    y = F.softmax(scores, dim=-1) @ v  # (B, H, T, D)
    y = y.reshape(-1, d).index_select(0, rows.back).view(1, -1, h * d)  # (1, N, C)
    return attn.out(y)
