"""Temperature scaling: fitted on validation, folded into the weights, accuracy unchanged."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from textserve.model import calibration  # noqa: E402
from textserve.model.classifier import ModelConfig, TransformerClassifier  # noqa: E402
from textserve.model.synthetic import synthetic_rows, write_jsonl  # noqa: E402
from textserve.model.train import TrainConfig, train  # noqa: E402
from textserve.tokenization import pad  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _drawn(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and labels drawn from softmax(logits): perfectly calibrated at T = 1."""
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(n, k, generator=g)
    labels = torch.multinomial(torch.softmax(logits, dim=1), 1, generator=g).squeeze(1)
    return logits, labels


@pytest.mark.parametrize("true_t", [0.5, 1.0, 3.0])
def test_the_fitted_temperature_undoes_a_known_one(true_t: float) -> None:
    logits, labels = _drawn(20_000, 3, seed=1)
    # Logits that are `true_t` times too confident: the fit divides by about true_t.
    fitted = calibration.fit_temperature(logits * true_t, labels)
    assert fitted == pytest.approx(true_t, rel=0.05)
    assert calibration.fit_temperature(logits * true_t, labels) == fitted  # deterministic


def test_logits_that_are_not_finite_are_not_calibrated(caplog: pytest.LogCaptureFixture) -> None:
    logits, labels = _drawn(200, 2, seed=4)
    logits[7, 1] = float("nan")
    with caplog.at_level(logging.WARNING, logger="textserve.model.train"):
        assert calibration.choose_temperature(logits, labels) is None
    assert "the validation logits are not all finite" in caplog.text
    assert calibration.choose_temperature(logits[:7].repeat(20, 1), labels[:7].repeat(20))


def test_calibration_figures_by_hand() -> None:
    # Two texts at confidence 0.9 (one right), two at 0.6 (both right), two labels.
    p = torch.tensor([0.9, 0.9, 0.6, 0.6])
    logits = torch.stack([torch.zeros(4), torch.log(p / (1 - p))], dim=1)
    labels = torch.tensor([1, 0, 1, 1])
    got = calibration.calibration_figures(logits, labels)
    assert got["ece"] == pytest.approx(0.5 * abs(0.5 - 0.9) + 0.5 * abs(1.0 - 0.6))
    assert got["mean_confidence"] == pytest.approx(0.75)
    want_nll = -(torch.log(p[0]) + torch.log(1 - p[1]) + 2 * torch.log(p[2])) / 4
    assert got["nll"] == pytest.approx(want_nll.item(), rel=1e-6)
    # Over-confident logits have the larger ECE and NLL; scaling them back restores both.
    logits_d, labels_d = _drawn(5_000, 2, seed=2)
    calibrated = calibration.calibration_figures(logits_d, labels_d)
    over = calibration.calibration_figures(logits_d * 3, labels_d)
    assert over["ece"] > calibrated["ece"] + 0.05 and over["nll"] > calibrated["nll"]


@pytest.mark.parametrize("bag", [0, 101])
def test_folding_divides_the_output_by_the_temperature(bag: int) -> None:
    cfg = ModelConfig.preset("tiny", vocab_size=40, num_labels=3, bag_buckets=bag)
    torch.manual_seed(0)
    model = TransformerClassifier(cfg).eval()
    if bag:
        with torch.no_grad():
            for table in (model.bag_ngram, model.bag_char, model.bag_bias):
                table.normal_()
            model.bag_char_norm.uniform_(0.5, 2.0)
    ids, mask = (torch.from_numpy(a) for a in pad([[3, 5, 7, 9], [4, 4], [8]], 0))
    with torch.inference_mode():
        before = model(ids, mask).clone()
    calibration.fold_temperature(model, 2.5)
    with torch.inference_mode():
        after = model(ids, mask)
    torch.testing.assert_close(after, before / 2.5, rtol=1e-5, atol=1e-6)


def _run(tmp_path: Path, name: str, **changes: object) -> dict[str, object]:
    data = tmp_path / "syn.jsonl"
    if not data.exists():  # 10 % of 1,200 texts: enough validation texts to calibrate
        write_jsonl(synthetic_rows(1200, seed=7), data)
    settings: dict[str, object] = {
        "data": data, "preset": "tiny", "epochs": 2, "batch_size": 32, "seed": 0,
        "device": "cpu", "threads": 1, "output_dir": tmp_path / name, "progress": False,
        "baseline": False,
    }  # fmt: skip
    settings.update(changes)
    run = train(TrainConfig(**settings))  # type: ignore[arg-type]
    metrics: dict[str, object] = json.loads((run / "metrics.json").read_text())
    return metrics


def test_a_run_is_calibrated_on_validation_and_keeps_its_predictions(tmp_path: Path) -> None:
    raw = _run(tmp_path, "raw", calibrate=False)
    calibrated = _run(tmp_path, "calibrated")
    assert "calibration" not in raw
    summary = calibrated["calibration"]
    assert isinstance(summary, dict)
    # Same seed, same encoder: scaling the logits changes no prediction, only the scores.
    assert calibrated["test"] == raw["test"] and calibrated["validation"] == raw["validation"]
    assert summary["temperature"] != 1.0
    val = summary["validation"]
    assert val["after"]["nll"] < val["before"]["nll"]  # the fit's objective, on its own data
    assert summary["test"]["before"]["nll"] != summary["test"]["after"]["nll"]
    for when in ("before", "after"):  # the diagram's bins cover the test split
        bins = summary["test_reliability"][when]
        assert sum(b["n"] for b in bins) == calibrated["test"]["n"]  # type: ignore[index]
    png = (tmp_path / "calibrated" / "calibration.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "raw" / "calibration.png").exists()
    # What is saved (and exported, and served) is the raw model's output divided by T.
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "raw" / "model.safetensors"))
    b = load_file(str(tmp_path / "calibrated" / "model.safetensors"))
    t = summary["temperature"]
    for name in a:
        want = a[name] / t if name.startswith("head.") else a[name]
        torch.testing.assert_close(b[name], want, rtol=1e-6, atol=0.0)


def test_too_few_validation_texts_are_not_calibrated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_jsonl(synthetic_rows(200, seed=7), tmp_path / "syn.jsonl")  # 21 validation texts
    with caplog.at_level(logging.WARNING, logger="textserve.model.train"):
        metrics = _run(tmp_path, "small", epochs=1)
    assert "calibration" not in metrics
    warned = [r.getMessage() for r in caplog.records]
    assert any("scores not calibrated: 21 validation texts" in m for m in warned)


def _hf_model(kind: str) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    small = {"vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 32, "max_position_embeddings": 40, "num_labels": 3}  # fmt: skip
    if kind == "bert":  # its head: `classifier`, a Linear
        return transformers.BertForSequenceClassification(transformers.BertConfig(**small))
    # RoBERTa's head ends in `classifier.out_proj`, after a dense layer of hidden_size outputs
    config = transformers.RobertaConfig(**small, pad_token_id=1)
    return transformers.RobertaForSequenceClassification(config)


class _Offset(torch.nn.Module):
    """A model whose output layer is not its last operation: logits = head(x) + 1."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> object:
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask)
        out.logits = out.logits + 1.0
        return out


@pytest.mark.parametrize("kind", ["bert", "roberta", "offset"])
def test_a_finetuned_model_is_calibrated_in_its_head_or_left_alone(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    from textserve.model.finetune import Pretrained, _calibrate
    from textserve.model.train import predict

    torch.manual_seed(0)
    hf = _hf_model("bert" if kind == "offset" else kind).eval()
    model = Pretrained(_Offset(hf) if kind == "offset" else hf)
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(3, 60, (5 + n % 30,), generator=g).tolist() for n in range(120)]
    device = torch.device("cpu")
    logits = predict(model, rows, device, pad_token_id=0)
    targets = (logits * 4).argmax(dim=1)  # labels the raw scores under-state: T < 1
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="textserve.model.train"):
        temperature = _calibrate(model, TrainConfig(), logits, (rows, targets), device, 0)
    after = predict(model, rows, device, pad_token_id=0)
    if kind == "offset":  # dividing the head's weights does not divide these logits: undone
        assert temperature is None
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
        assert "no output layer of _Offset divides its logits" in caplog.text
    else:
        assert temperature is not None and temperature < 1.0
        torch.testing.assert_close(after, logits / temperature, rtol=1e-4, atol=1e-5)
