"""textserve.export.bench runs every engine side by side; figures are reported, never asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from textserve.export import bench

ENGINES = ["pytorch fp32", "pytorch int8", "onnxruntime fp32", "onnxruntime int8"]


def test_every_engine_at_every_batch_size(tiny_run: Path) -> None:
    messages: list[str] = []
    result = bench.run_benchmark(
        tiny_run, batch_sizes=(1, 4), rounds=2, min_seconds=0.0, max_texts=12,
        progress=messages.append,
    )  # fmt: skip
    assert [(m.engine, m.batch_size) for m in result.measurements] == [
        (e, b) for b in (1, 4) for e in ENGINES
    ]
    for m in result.measurements:
        assert len(m.rounds) == 2 and m.texts_per_second > 0
        assert 0.0 <= m.accuracy <= 1.0
    # fp32 onnxruntime is the same model as PyTorch: same predictions, same accuracy
    for b in (1, 4):
        fp32 = result.get("onnxruntime fp32", b)
        eager = result.get("pytorch fp32", b)
        assert fp32 is not None and eager is not None and fp32.accuracy == eager.accuracy
    ratios = result.ratios()
    assert {"onnxruntime/pytorch fp32 @ batch 1", "int8/fp32 onnxruntime @ batch 4"} <= set(ratios)
    assert any("round 2/2" in msg for msg in messages)  # progress is reported
    report = bench.format_report(result)
    assert "onnxruntime int8" in report and "ratios (of the median rounds" in report
    low, mid, high = result.round_ratios()["int8/fp32 onnxruntime @ batch 4"]
    assert 0 < low <= mid <= high
    json.dumps(result.to_dict())  # serialisable for --json


def test_graphs_come_from_the_repository_when_it_has_them(
    tiny_run: Path, tiny_repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    argv = [str(tiny_run), "--repository", str(tiny_repository), "--name", "tiny",
            "--batch-sizes", "2", "--rounds", "1", "--min-seconds", "0", "--max-texts", "4",
            "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    saved = json.loads(out.read_text())
    assert saved["graphs"]["fp32"] == str(tiny_repository / "tiny" / "1" / "model.onnx")
    assert saved["graphs"]["int8"].endswith("int8.onnx")  # built, the repository has none
    assert "texts/s" in capsys.readouterr().out


def test_the_bert_shaped_bench_runs_every_engine() -> None:
    pytest.importorskip("transformers")
    tiny = {**bench.SHAPE, "num_hidden_layers": 1, "hidden_size": 32,
            "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 3000}  # fmt: skip
    result, notes = bench.bert_benchmark(batch_sizes=(1, 4), n_texts=8, rounds=1,
                                         min_seconds=0.0, shape=tiny)  # fmt: skip
    assert [(m.engine, m.batch_size) for m in result.measurements] == [
        (e, b) for b in (1, 4) for e in bench.BERT_ENGINES
    ]
    assert all(m.texts_per_second > 0 for m in result.measurements)
    # the fp32 graphs are PyTorch's model; int8 moves logits, but not far
    assert notes["max_abs_logit_diff"]["onnxruntime fp32"] < 1e-4
    assert notes["max_abs_logit_diff"]["onnxruntime optimized"] < 1e-4
    assert "onnxruntime int8" in bench.format_bert_report(result, notes)
