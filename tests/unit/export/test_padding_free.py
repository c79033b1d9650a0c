"""PaddingFreeClassifier (the published graph's form) against TransformerClassifier, in PyTorch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from textserve.export.padding_free import PaddingFreeClassifier  # noqa: E402
from textserve.model.classifier import ModelConfig, TransformerClassifier  # noqa: E402

VOCAB = 50
# Same weights, same arithmetic per real token; only the GEMM row counts differ, which may
# change float rounding. The export's own bound (|Δlogit| <= 1e-4) is far looser.
ATOL = 1e-5


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def make_model(**overrides: object) -> TransformerClassifier:
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=VOCAB, num_labels=3, **overrides)
    model = TransformerClassifier(cfg).eval()
    if cfg.bag_buckets:  # the bag's tables are fitted after training; random ones here
        for name in ("bag_ngram", "bag_char", "bag_char_norm", "bag_bias"):
            getattr(model, name).copy_(torch.rand_like(getattr(model, name)))
    return model


def batch(lengths: list[int], width: int, *, left: bool = False) -> tuple[torch.Tensor, ...]:
    """Random ids under a 0/1 mask with these real lengths (padding on the right by default)."""
    ids = torch.randint(1, VOCAB, (len(lengths), width))
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        if left:
            mask[row, width - n :] = 1
        else:
            mask[row, :n] = 1
    ids[mask == 0] = 0
    return ids, mask


def both(model: TransformerClassifier, ids: torch.Tensor, mask: torch.Tensor):  # type: ignore[no-untyped-def]
    with torch.inference_mode():
        return model(ids, mask), PaddingFreeClassifier(model).eval()(ids, mask)


VARIANTS = [
    {},
    {"norm_first": True},
    {"positional": "learned"},
    {"n_layers": 3, "n_heads": 4},
    {"bag_buckets": 97, "encoder_weight": 0.5},
]


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: ",".join(o) or "default")
def test_same_logits_as_the_model_with_mixed_padding(overrides: dict[str, object]) -> None:
    model = make_model(**overrides)
    ids, mask = batch([64, 1, 17, 40, 3, 64, 9], 64)
    want, got = both(model, ids, mask)
    assert got.dtype == torch.float32 and got.shape == (7, 3)
    torch.testing.assert_close(got, want, rtol=0.0, atol=ATOL)


@pytest.mark.parametrize(("lengths", "width"), [([5], 5), ([1], 1), ([8, 8, 8], 8)])
def test_same_logits_without_any_padding(lengths: list[int], width: int) -> None:
    want, got = both(make_model(), *batch(lengths, width))
    torch.testing.assert_close(got, want, rtol=0.0, atol=ATOL)


def test_left_padding_and_rows_without_a_real_token() -> None:
    # The graph contract allows any 0/1 mask: left padding, and rows with no real token (the
    # model gives those the head's bias), even a whole batch of them.
    model = make_model()
    ids, mask = batch([3, 12, 1, 12], 12, left=True)
    mask[2] = 0
    want, got = both(model, ids, mask)
    torch.testing.assert_close(got, want, rtol=0.0, atol=ATOL)
    torch.testing.assert_close(got[2], model.head.bias.detach(), rtol=0.0, atol=ATOL)
    want, got = both(model, *batch([0, 0], 6))
    torch.testing.assert_close(got, want, rtol=0.0, atol=ATOL)


def test_a_text_gets_the_same_logits_whatever_its_batch() -> None:
    model = PaddingFreeClassifier(make_model()).eval()
    ids, mask = batch([7], 7)
    long_ids, long_mask = (torch.nn.functional.pad(x, (0, 30)) for x in (ids, mask))
    others, others_mask = batch([37, 2], 37)
    with torch.inference_mode():
        alone = model(ids, mask)
        padded = model(long_ids, long_mask)
        in_batch = model(torch.cat([long_ids, others]), torch.cat([long_mask, others_mask]))
    torch.testing.assert_close(padded, alone, rtol=0.0, atol=ATOL)
    torch.testing.assert_close(in_batch[:1], alone, rtol=0.0, atol=ATOL)


def test_attention_logits_in_the_thousands_change_nothing() -> None:
    # Padding keys copy a real key of their row, PADDING_PENALTY lower. With logits in the
    # thousands that is nothing against the spread of real scores: only copying within the
    # row keeps a padding key from outscoring the row's real keys (left padding included).
    model = make_model()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(40.0)  # attention logits in the thousands
    for left in (False, True):
        want, got = both(model, *batch([20, 6, 13], 20, left=left))
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=0.0, atol=ATOL)


def test_only_a_transformer_classifier_is_accepted() -> None:
    with pytest.raises(TypeError, match="wraps a TransformerClassifier, got Linear"):
        PaddingFreeClassifier(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
