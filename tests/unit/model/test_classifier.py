"""The TransformerClassifier against the paper's formulas and torch.nn's reference modules."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from textserve.model.classifier import (  # noqa: E402 - after the importorskip on purpose
    PRESETS,
    EncoderBlock,
    ModelConfig,
    MultiHeadSelfAttention,
    TransformerClassifier,
    sinusoidal_table,
)

VOCAB = 50


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # the CI machine is shared; these tensors are tiny anyway


def make_model(**overrides: object) -> TransformerClassifier:
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=VOCAB, num_labels=3, **overrides)
    model = TransformerClassifier(cfg).eval()
    if cfg.bag_buckets:  # the bag's tables are fitted after training; random ones here
        for name in ("bag_ngram", "bag_char", "bag_char_norm", "bag_bias"):
            getattr(model, name).copy_(torch.rand_like(getattr(model, name)))
    return model


def padded(ids: list[int], length: int, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    row = torch.full((1, length), pad_id, dtype=torch.long)
    row[0, : len(ids)] = torch.tensor(ids)
    mask = torch.zeros((1, length), dtype=torch.long)
    mask[0, : len(ids)] = 1
    return row, mask


VARIANTS = [
    {},
    {"norm_first": True},
    {"positional": "learned"},
    {"n_layers": 3, "n_heads": 4},
    {"bag_buckets": 97, "encoder_weight": 0.5},
]


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: ",".join(o) or "default")
def test_padding_does_not_change_logits(overrides: dict[str, object]) -> None:
    model = make_model(**overrides)
    seq = [5, 17, 3, 42, 8, 11, 29]
    with torch.no_grad():
        alone = model(*padded(seq, len(seq)))
        four_times = model(*padded(seq, 4 * len(seq)))
        # In a batch, padded to a longer neighbour, and with junk ids under mask 0: the mask,
        # not the pad id, must decide what is padding.
        ids = torch.randint(1, VOCAB, (3, 4 * len(seq)))
        mask = torch.ones_like(ids)
        ids[1, : len(seq)] = torch.tensor(seq)
        mask[1, len(seq) :] = 0
        mask[2, 5:] = 0
        in_batch = model(ids, mask)[1:2]
    assert (alone - four_times).abs().max().item() <= 1e-5
    assert (alone - in_batch).abs().max().item() <= 1e-5


def test_pooling_is_masked_not_a_plain_mean() -> None:
    # The same model with a plain mean over padded positions would fail the padding test; make
    # sure that test has teeth by checking the padded positions really carry non-zero states.
    model = make_model()
    ids, mask = padded([5, 6, 7], 12)
    with torch.no_grad():
        x = model.tok_emb(ids) * model.embed_scale + model.positions(12)
        for block in model.blocks:
            x = block(x, mask)
    assert x[0, 3:].abs().sum() > 0
    plain = model.head(x.mean(dim=1))
    with torch.no_grad():
        assert (plain - model(ids, mask)).abs().max() > 1e-3


def test_attention_matches_torch_multihead_attention() -> None:
    torch.manual_seed(1)
    d, h = 32, 4
    ref = torch.nn.MultiheadAttention(d, h, dropout=0.0, batch_first=True).eval()
    ours = MultiHeadSelfAttention(d, h).eval()
    with torch.no_grad():
        ours.qkv.weight.copy_(ref.in_proj_weight)
        ours.qkv.bias.copy_(ref.in_proj_bias)
        ours.out.weight.copy_(ref.out_proj.weight)
        ours.out.bias.copy_(ref.out_proj.bias)
        x = torch.randn(3, 9, d)
        mask = torch.ones(3, 9, dtype=torch.long)
        mask[1, 4:] = 0
        mask[2, 1:] = 0
        expected, _ = ref(x, x, x, key_padding_mask=mask == 0, need_weights=False)
        got = ours(x, mask)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_block_matches_torch_transformer_encoder_layer(norm_first: bool) -> None:
    torch.manual_seed(2)
    cfg = ModelConfig(
        vocab_size=VOCAB, d_model=32, n_heads=4, d_ff=64, dropout=0.0, attention_dropout=0.0,
        norm_first=norm_first,
    )  # fmt: skip
    ref = torch.nn.TransformerEncoderLayer(
        cfg.d_model, cfg.n_heads, cfg.d_ff, dropout=0.0, activation="gelu",
        batch_first=True, norm_first=norm_first, layer_norm_eps=cfg.layer_norm_eps,
    ).eval()  # fmt: skip
    ours = EncoderBlock(cfg).eval()
    for p in ref.parameters():  # LayerNorm starts at (1, 0): randomise so the test can fail
        torch.nn.init.normal_(p, std=0.2)
    mapping = {
        "attn.qkv.weight": "self_attn.in_proj_weight",
        "attn.qkv.bias": "self_attn.in_proj_bias",
        "attn.out.weight": "self_attn.out_proj.weight",
        "attn.out.bias": "self_attn.out_proj.bias",
        "ff.linear1.weight": "linear1.weight",
        "ff.linear1.bias": "linear1.bias",
        "ff.linear2.weight": "linear2.weight",
        "ff.linear2.bias": "linear2.bias",
        "norm1.weight": "norm1.weight",
        "norm1.bias": "norm1.bias",
        "norm2.weight": "norm2.weight",
        "norm2.bias": "norm2.bias",
    }
    ref_state = ref.state_dict()
    assert set(mapping) == set(ours.state_dict())
    ours.load_state_dict({k: ref_state[v] for k, v in mapping.items()})
    x = torch.randn(2, 7, cfg.d_model)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 3:] = 0
    expected = ref(x, src_key_padding_mask=mask == 0)  # grad enabled: no fast path
    got = ours(x, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)


def test_sinusoidal_table_matches_the_formula() -> None:
    length, d = 50, 16
    table = sinusoidal_table(length, d)
    assert table.shape == (length, d)
    for pos in range(length):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    model = make_model()
    torch.testing.assert_close(model.positions(10), sinusoidal_table(64, 32)[:10])


def test_odd_width_table() -> None:
    table = sinusoidal_table(4, 5)
    assert table[3, 4].item() == pytest.approx(math.sin(3 / 10000 ** (4 / 5)), abs=1e-6)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_model_is_order_sensitive(positional: str) -> None:
    model = make_model(positional=positional)
    seq = [5, 17, 3, 42, 8, 11]
    with torch.no_grad():
        forward = model(*padded(seq, len(seq)))
        backward = model(*padded(seq[::-1], len(seq)))
    assert (forward - backward).abs().max().item() > 1e-4


def test_tiny_model_overfits_a_tiny_data_set() -> None:
    torch.manual_seed(3)
    model = TransformerClassifier(
        ModelConfig.preset("tiny", vocab_size=VOCAB, num_labels=2, dropout=0.0)
    )
    ids = torch.randint(1, VOCAB, (16, 10))
    mask = torch.ones_like(ids)
    mask[::2, 6:] = 0
    labels = torch.arange(16) % 2  # arbitrary labels: only memorisation can fit them
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(150):
        loss = torch.nn.functional.cross_entropy(model(ids, mask), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(ids, mask).argmax(dim=1) == labels).float().mean().item()
    assert accuracy == 1.0
    assert loss.item() < 0.05


def test_output_shape_dtype_and_pad_row() -> None:
    model = make_model()
    ids, mask = padded([1, 2, 3], 5)
    with torch.no_grad():
        logits = model(ids.repeat(4, 1), mask.repeat(4, 1))
    assert logits.shape == (4, 3)
    assert logits.dtype == torch.float32
    assert model.tok_emb.weight[0].abs().sum().item() == 0.0


def test_sinusoidal_table_is_not_in_the_weights() -> None:
    assert "pos_table" not in make_model().state_dict()
    assert "pos_emb" in make_model(positional="learned").state_dict()


def test_presets_and_overrides() -> None:
    base = ModelConfig.preset("base")
    assert (base.d_model, base.n_heads, base.d_ff, base.n_layers) == (256, 8, 1024, 4)
    assert set(PRESETS) == {"tiny", "small", "base"}
    cfg = ModelConfig.preset("small", num_labels=5)
    assert cfg.num_labels == 5
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        ModelConfig.preset("huge")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"d_model": 30, "n_heads": 4}, "must be divisible by n_heads"),
        ({"positional": "rotary"}, "positional must be one of"),
        ({"num_labels": 1}, "num_labels must be >= 2"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
    ],
)
def test_invalid_configs_say_why(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig.preset("tiny", **overrides)


def test_from_dict_rejects_unknown_fields() -> None:
    with pytest.raises(ValueError, match="unknown ModelConfig field"):
        ModelConfig.from_dict({**ModelConfig().to_dict(), "depth": 3})
