"""export.checks on hand-built graphs and a PyTorch twin: fast, no training, no exporter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.handmade import make_onnx

torch = pytest.importorskip("torch")
checks = pytest.importorskip("textserve.export.checks")
from textserve.export.errors import CheckFailed  # noqa: E402

VOCAB, LABELS = 50, 3


class MeanEmbedding(torch.nn.Module):
    """PyTorch twin of tests/handmade.make_onnx: masked mean of W[input_ids]."""

    def __init__(self, weights: np.ndarray) -> None:
        super().__init__()
        self.weights = torch.nn.Parameter(torch.from_numpy(weights.copy()))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).float()  # (B, T, 1)
        return (self.weights[input_ids] * mask).sum(1) / mask.sum(1)  # (B, L)


@pytest.fixture()
def graph(tmp_path: Path) -> tuple[Path, np.ndarray]:
    model = make_onnx(VOCAB, LABELS, seed=3)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    weights = onnx.numpy_helper.to_array(model.graph.initializer[0])
    return path, weights


def test_parity_feeds_cover_the_shapes_with_mixed_padding() -> None:
    feeds = checks.parity_feeds(max_length=64, vocab_size=VOCAB, pad_token_id=0)
    batches = [(f["input_ids"], f["attention_mask"]) for f in feeds]
    assert all(list(f) == ["input_ids", "attention_mask"] for f in feeds)
    shapes = {ids.shape for ids, _ in batches}
    assert shapes == {(b, t) for b in (1, 7, 64) for t in (1, 5, 37, 64)}
    for ids, mask in batches:
        assert ids.dtype == mask.dtype == np.int64
        assert np.all(ids[mask == 0] == 0) and np.all(ids[mask == 1] != 0)
        assert mask[0].all()  # one row fills the batch's length
        b, t = ids.shape
        if b > 1 and t > 1:
            assert mask[1].sum() == 1  # and another is mostly padding
        # masks are left-aligned: real tokens first, then padding
        assert np.all(np.diff(mask, axis=1) <= 0)


def test_parity_feeds_never_exceed_max_length() -> None:
    feeds = checks.parity_feeds(max_length=20, vocab_size=VOCAB)
    assert {f["input_ids"].shape[1] for f in feeds} == {1, 5, 20}


def test_parity_feeds_give_type_ids_where_the_graph_takes_them() -> None:
    # a graph's inputs in its forward()'s order; type ids random on real tokens, 0 on padding
    inputs = ["input_ids", "token_type_ids", "attention_mask"]
    feeds = checks.parity_feeds(max_length=20, vocab_size=VOCAB, pad_token_id=1, inputs=inputs)
    for feed in feeds:
        assert list(feed) == inputs
        assert np.all(feed["token_type_ids"][feed["attention_mask"] == 0] == 0)
        assert np.all(feed["input_ids"][feed["attention_mask"] == 1] != 1)
    assert any(feed["token_type_ids"].any() for feed in feeds)


def test_assert_parity_passes_for_the_same_function(graph: tuple[Path, np.ndarray]) -> None:
    path, weights = graph
    inputs = checks.parity_feeds(max_length=40, vocab_size=VOCAB)
    report = checks.assert_parity(path, MeanEmbedding(weights), inputs, rtol=0, atol=1e-5)
    assert report.max_abs_logit_diff <= 1e-5
    assert report.cases == len(inputs) and report.rows == sum(len(f["input_ids"]) for f in inputs)
    assert report.argmax_agreement == 1.0


def test_assert_parity_names_the_figure_and_the_shape(graph: tuple[Path, np.ndarray]) -> None:
    path, weights = graph
    wrong = weights.copy()
    wrong[7] += 0.5  # one token's row differs: only batches containing token 7 disagree
    inputs = checks.parity_feeds(max_length=40, vocab_size=VOCAB)
    with pytest.raises(
        CheckFailed, match=r"parity \(fp32\) check failed: max \|Δlogit\| .* at batch"
    ) as info:
        checks.assert_parity(path, MeanEmbedding(wrong), inputs, rtol=0, atol=1e-4)
    assert info.value.check == "parity (fp32)"
    assert info.value.figure is not None and info.value.figure > 1e-4
    assert info.value.limit == 1e-4


def test_check_model_accepts_the_contract(graph: tuple[Path, np.ndarray]) -> None:
    path, _ = graph
    assert checks.check_model(path, num_labels=LABELS) == 17


def _save(model: onnx.ModelProto, tmp_path: Path) -> Path:
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))
    return path


def test_check_model_rejects_a_fixed_batch_axis(tmp_path: Path) -> None:
    model = make_onnx(VOCAB, LABELS)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2  # frozen at export shape
    with pytest.raises(CheckFailed, match=r"input_ids axis 0 .* not dynamic"):
        checks.check_model(_save(model, tmp_path), num_labels=LABELS)


def test_check_model_rejects_an_old_opset(tmp_path: Path) -> None:
    model = make_onnx(VOCAB, LABELS)
    model.opset_import[0].version = 16
    with pytest.raises(CheckFailed, match="opset 16 < 17"):
        checks.check_model(_save(model, tmp_path), num_labels=LABELS)


def test_check_model_rejects_wrong_names_and_widths(tmp_path: Path) -> None:
    path = _save(make_onnx(VOCAB, LABELS), tmp_path)
    with pytest.raises(CheckFailed, match=f"logits axis 1 is {LABELS}, expected {LABELS + 1}"):
        checks.check_model(path, num_labels=LABELS + 1)  # config says another label count
    model = make_onnx(VOCAB, LABELS)
    model.graph.node[-1].output[0] = "scores"
    model.graph.output[0].name = "scores"
    with pytest.raises(CheckFailed, match=r"outputs \['scores'\]"):
        checks.check_model(_save(model, tmp_path), num_labels=LABELS)
    model = make_onnx(VOCAB, LABELS)
    model.graph.input[1].name = "mask"
    model.graph.node[1].input[0] = "mask"
    with pytest.raises(CheckFailed, match=r"inputs \['input_ids', 'mask'\]"):
        checks.check_model(_save(model, tmp_path), num_labels=LABELS)


def test_check_model_runs_the_full_onnx_checker(tmp_path: Path) -> None:
    model = make_onnx(VOCAB, LABELS)
    # A node reading a tensor nobody produces: invalid for onnx.checker.
    model.graph.node.append(helper.make_node("Relu", ["nowhere"], ["x"]))
    with pytest.raises(CheckFailed, match=r"onnx\.checker check failed"):
        checks.check_model(_save(model, tmp_path), num_labels=LABELS)


def test_check_agreement_reports_how_many_texts_differ() -> None:
    report = checks.SplitReport(
        n=200, argmax_agreement=0.99, accuracy=0.8, reference_accuracy=0.8, max_abs_logit_diff=1
    )
    with pytest.raises(CheckFailed, match=r"99.00% \(2 of 200 texts"):
        checks.check_agreement(report)
    checks.check_agreement(report, minimum=0.99)


def test_check_accuracy_drop_in_points() -> None:
    assert checks.check_accuracy_drop(0.80, 0.795, max_drop_points=1.0, label="int8") == (
        pytest.approx(0.5)
    )
    with pytest.raises(CheckFailed, match=r"drops 2\.00 points") as info:
        checks.check_accuracy_drop(0.80, 0.78, max_drop_points=1.0, label="int8")
    assert info.value.check == "int8 accuracy" and info.value.figure == pytest.approx(2.0)
    # a gain is never a failure
    assert checks.check_accuracy_drop(0.80, 0.90, max_drop_points=0.0, label="int8") < 0


def test_accuracy() -> None:
    logits = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]], dtype=np.float32)
    assert checks.accuracy(logits, [0, 1, 1]) == pytest.approx(2 / 3)
