"""The linear bag of token n-grams beside the encoder: its graph-side features and its fitting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from sklearn.linear_model import LogisticRegression  # noqa: E402

from textserve.model.bag import BAG_C, design, fit_bag, nb_ratio  # noqa: E402
from textserve.model.baseline import fit_baseline  # noqa: E402
from textserve.model.classifier import (  # noqa: E402
    BAG_HASH_MULTIPLIER,
    ModelConfig,
    TransformerClassifier,
    bag_features,
)
from textserve.model.data import LabelledData  # noqa: E402
from textserve.model.synthetic import synthetic_rows, write_jsonl  # noqa: E402
from textserve.model.train import (  # noqa: E402
    TrainConfig,
    _fit_bag_and_validate,
    load_splits,
    predict,
    train,
)
from textserve.tokenization import pad  # noqa: E402

VOCAB, BUCKETS = 40, 101


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def reference_ngrams(row: list[int]) -> set[int]:
    """The bag's n-gram rows of one text, written the plain way: a set."""
    prev = [0, *row[:-1]]
    bigrams = {
        VOCAB + (p * BAG_HASH_MULTIPLIER + t) % BUCKETS for p, t in zip(prev, row, strict=True)
    }
    return set(row) | bigrams


def test_features_are_a_binary_bag_whatever_the_padding() -> None:
    rows = [[5, 7, 5, 7, 5], [3], [9, 9, 9, 2]]
    ids, mask = (torch.from_numpy(a) for a in pad(rows, 0))
    wide = torch.cat([ids, torch.randint(1, VOCAB, (3, 4))], dim=1)  # junk under mask 0
    wide_mask = torch.cat([mask, torch.zeros(3, 4, dtype=torch.long)], dim=1)
    for i, m in ((ids, mask), (wide, wide_mask)):
        feats, weights = bag_features(i, m, VOCAB, BUCKETS)
        for row, f, w in zip(rows, feats, weights, strict=True):
            got: dict[int, float] = {}
            for r, x in zip(f.tolist(), w.tolist(), strict=True):
                got[r] = got.get(r, 0.0) + x
            # every n-gram of the text weighs 1 in all, however often it occurs; nothing else
            assert {r for r, x in got.items() if x > 0} == reference_ngrams(row)
            assert all(abs(x - 1.0) < 1e-6 for x in got.values() if x > 0)


def cued_rows(labels: int, n: int = 120, noise: float = 0.0) -> tuple[list[list[int]], np.ndarray]:
    rng = np.random.default_rng(labels)
    rows = [rng.integers(2, VOCAB, rng.integers(1, 12)).tolist() for _ in range(n)]
    # the label is carried by a cue token (on a `noise` share of the texts, a wrong one), so
    # the bag has something to learn
    y = np.arange(len(rows)) % labels
    for row, label in zip(rows, y, strict=True):
        cue = int(label) if rng.random() >= noise else int(rng.integers(0, labels))
        row.insert(int(rng.integers(0, len(row) + 1)), 2 + cue)
    return rows, y


def fitted_model(labels: int) -> tuple[TransformerClassifier, list[list[int]], np.ndarray]:
    rows, y = cued_rows(labels)
    vocab = [f"tok{i}" for i in range(VOCAB)]
    cfg = ModelConfig.preset("tiny", vocab_size=VOCAB, num_labels=labels, bag_buckets=BUCKETS)
    model = TransformerClassifier(cfg).eval()
    fit_bag(model, rows, y.tolist(), vocab)
    return model, rows, y


class _Tokens:
    """The one tokenizer method the bag's fitting reads."""

    def id_to_token(self, i: int) -> str:
        return f"tok{i}"


def _tables(model: TransformerClassifier) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if k.startswith("bag_")}


@pytest.mark.parametrize("refit", [True, False])
def test_the_shipped_bag_is_refitted_on_training_and_validation(refit: bool) -> None:
    # The validation figures come from the bag fitted on the training split; the model that
    # ships has the bag fitted again on training + validation (or not, with --no-bag-refit).
    rows, y = cued_rows(2, n=160, noise=0.3)
    encoded = {
        "train": (rows[:100], torch.tensor(y[:100])),
        "validation": (rows[100:], torch.tensor(y[100:])),
    }
    vocab, device = [f"tok{i}" for i in range(VOCAB)], torch.device("cpu")
    cfg = ModelConfig.preset("tiny", vocab_size=VOCAB, num_labels=2, bag_buckets=BUCKETS)
    torch.manual_seed(0)
    model = TransformerClassifier(cfg).eval()
    train_only, both = TransformerClassifier(cfg).eval(), TransformerClassifier(cfg).eval()
    train_only.load_state_dict(model.state_dict())
    both.load_state_dict(model.state_dict())
    fit_bag(train_only, rows[:100], y[:100].tolist(), vocab)
    fit_bag(both, rows, y.tolist(), vocab)
    assert not torch.equal(_tables(train_only)["bag_ngram"], _tables(both)["bag_ngram"])

    bag, val_logits, refitted = _fit_bag_and_validate(
        model, TrainConfig(bag_refit=refit), encoded, _Tokens(), device
    )
    assert bag is not None and refitted is refit
    assert bag["fitted_on"] == ("train + validation" if refit else "train")
    want = both if refit else train_only
    assert all(torch.equal(v, _tables(want)[k]) for k, v in _tables(model).items())
    torch.testing.assert_close(val_logits, predict(train_only, encoded["validation"][0], device))


@pytest.mark.parametrize("labels", [2, 3])
def test_the_graph_bag_computes_the_fitted_regression(labels: int) -> None:
    # The tables folded into the model give, from token ids alone, the decision function of
    # the logistic regression fitted on the sparse features (one per label; label 1 for two).
    model, rows, y = fitted_model(labels)
    d = design(model, rows, [f"tok{i}" for i in range(VOCAB)])
    ids, mask = (torch.from_numpy(a) for a in pad(rows, 0))
    with torch.inference_mode():
        got = model.bag_logits(ids, mask).numpy()
    for label in [1] if labels == 2 else range(labels):
        positive = y == label
        lr = LogisticRegression(C=BAG_C, max_iter=3000)
        want = lr.fit(d.features(nb_ratio(d.binary, positive)), positive).decision_function(
            d.features(nb_ratio(d.binary, positive))
        )
        np.testing.assert_allclose(got[:, label], want, atol=1e-4)
    if labels == 2:
        assert np.all(got[:, 0] == 0.0)
    assert (got.argmax(1) == y).mean() > 0.9


def test_model_output_is_the_weighted_sum() -> None:
    model, rows, _ = fitted_model(2)
    ids, mask = (torch.from_numpy(a) for a in pad(rows, 0))
    with torch.inference_mode():
        total = model(ids, mask)
        parts = model.config.encoder_weight * model.encoder_logits(ids, mask)
        parts = parts + model.bag_logits(ids, mask)
    assert torch.allclose(total, parts, atol=1e-6)


def test_a_run_with_a_bag_records_it_and_reproduces(tmp_path: Path) -> None:
    data = write_jsonl(synthetic_rows(200, seed=1), tmp_path / "d.jsonl")

    def run(name: str) -> Path:
        cfg = TrainConfig(
            data=data, preset="tiny", model_overrides={"bag_buckets": 4096, "encoder_weight": 0.75},
            epochs=2, batch_size=16, seed=3, device="cpu", threads=1,
            output_dir=tmp_path / name, progress=False,
        )  # fmt: skip
        return train(cfg)

    first, second = run("a"), run("b")
    metrics = json.loads((first / "metrics.json").read_text())
    assert metrics["bag"]["model"].startswith("bag: NB-weighted")
    # The bag was refitted on training + validation, so the baseline's test figures are those
    # of its own refit on the same texts (like for like); its first fit's stay beside them.
    assert metrics["bag"]["fitted_on"] == metrics["baseline"]["fitted_on"] == "train + validation"
    splits, labels = load_splits(TrainConfig(data=data, seed=3))
    index = {name: i for i, name in enumerate(labels)}

    def baseline_on(*parts: LabelledData) -> Any:
        texts = [t for p in parts for t in p.texts]
        ys = [index[y] for p in parts for y in p.labels]
        test = (splits.test.texts, [index[y] for y in splits.test.labels])
        return fit_baseline(texts, ys, {"test": test}, labels)["test"]

    assert metrics["baseline"]["test"] == baseline_on(splits.train, splits.validation)
    assert metrics["baseline"]["train_only_test"] == baseline_on(splits.train)
    assert {"encoder_test_accuracy", "encoder_test_macro_f1"} <= set(metrics["bag"])
    from safetensors.torch import load_file

    a, b = load_file(str(first / "model.safetensors")), load_file(str(second / "model.safetensors"))
    assert {"bag_ngram", "bag_char", "bag_char_norm", "bag_bias"} <= set(a)
    assert a["bag_ngram"].abs().sum() > 0
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert metrics["test"] == json.loads((second / "metrics.json").read_text())["test"]
