"""The GPU path, checked on CPU: an fp16 version served (float32 logits, its accuracy against the
fp32 version's on the CPU provider), GetModel and textserve_model_info saying where and in what
precision each version runs, and the prepared GPU check (bench/gpu_check.py) run dry end to end.
The same fp16 version on CUDA is the GPU-marked test, skipped where there is no CUDA provider."""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from tests.serving import ROOT, running_server
from textserve.bench import gpu_check
from textserve.export.pipeline import export_run
from textserve.service.config import RuntimeConfig
from textserve.service.engine.runtime import CUDA, available_providers
from textserve.service.metrics import Metrics
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow
TOOLS = ROOT / ".tools" / "perf_analyzer"  # as tests/system/test_perf_analyzer.py sets it up


@pytest.fixture(scope="module")
def two_precisions(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with the tiny run as `full` (fp32) and `half` (fp16)."""
    repository = tmp_path_factory.mktemp("precisions")
    export_run(tiny_run, repository, "full", threads=1)
    export_run(tiny_run, repository, "half", fp16=True, threads=1)
    return repository


def texts(tiny_run: Path) -> list[str]:
    lines = (tiny_run / "test.jsonl").read_text().splitlines()
    return [json.loads(line)["text"] for line in lines if line.strip()]


def scores(
    stub: pb_grpc.ClassifierStub, model: str, batch: list[str]
) -> tuple[np.ndarray, list[int]]:
    response = stub.Classify(pb.ClassifyRequest(texts=batch, model=model, all_scores=True))
    probabilities = np.array([list(r.scores) for r in response.results])
    labels = [int(np.argmax(row)) for row in probabilities]
    return probabilities, labels


def served_on(device: str, two_precisions: Path, tiny_run: Path) -> None:
    metrics = Metrics(CollectorRegistry())
    with (
        running_server(
            two_precisions,
            metrics=metrics,
            model="full",
            runtime=RuntimeConfig(device=device, intra_op_threads=1),
        ) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.ClassifierStub(channel)
        provider = "CUDAExecutionProvider" if device == "cuda" else "CPUExecutionProvider"
        for name, precision in (("full", "fp32"), ("half", "fp16")):
            info = stub.GetModel(pb.GetModelRequest(name=name))
            assert (info.execution_provider, info.precision) == (provider, precision)
            labels = {"model": name, "version": "1", "provider": provider}
            value = metrics.registry.get_sample_value
            assert value("textserve_model_info", {**labels, "precision": precision}) == 1
        batch = texts(tiny_run)[:200]
        full, full_labels = scores(stub, "full", batch)
        half, half_labels = scores(stub, "half", batch)
    assert np.isfinite(half).all()
    np.testing.assert_allclose(half.sum(axis=1), 1.0, atol=1e-5)
    # fp16 weights and arithmetic: probabilities within 1e-2, labels the same but for ties
    assert float(np.abs(half - full).max()) < 1e-2
    agreement = np.mean(np.array(half_labels) == np.array(full_labels))
    assert agreement >= 0.99, agreement


def test_an_fp16_version_is_served_with_float32_scores_close_to_fp32(
    two_precisions: Path, tiny_run: Path
) -> None:
    served_on("cpu", two_precisions, tiny_run)


@pytest.mark.gpu
@pytest.mark.skipif(
    CUDA not in available_providers(), reason="onnxruntime offers no CUDA execution provider"
)
def test_an_fp16_version_on_cuda(two_precisions: Path, tiny_run: Path) -> None:
    served_on("cuda", two_precisions, tiny_run)


MEASURED = {
    "train", "export_fp16", "export_fp32", "texts", "ceiling_fp16", "ceiling_fp32",
    "tokenize_all_cores", "tokenize_one_at_a_time", "perf_analyzer_setup",
}  # fmt: skip
SERVED = {
    f"server_w{workers}_{engine}_{load}"
    for load in ("1x8", "8x4")
    for workers, engine in ((1, "thread"), (2, "thread"), (2, "shared"))
} | {"cpu_workers"}


def test_the_gpu_check_runs_dry_on_cpu(tmp_path: Path) -> None:
    """Every step but the CUDA and NVML ones, small, on CPU; perf_analyzer's steps may be
    skipped only where the tool could not be set up (no package index) and is absent."""
    out = tmp_path / "check"
    status = gpu_check.main(["--dry-run", "--output", str(out), "--tools", str(TOOLS)])
    results = json.loads((out / "gpu_check.json").read_text())
    steps = results["steps"]
    assert set(steps) == MEASURED | SERVED
    assert all(steps[name]["status"] == 0 for name in MEASURED - {"perf_analyzer_setup"})
    accuracy = {p: m["test_accuracy"] for p, m in results["models"].items()}
    assert set(accuracy) == {"fp32", "fp16"} and all(0 <= a <= 1 for a in accuracy.values())
    assert accuracy["fp32"] - accuracy["fp16"] <= 0.01  # the export's --max-accuracy-drop
    assert 48 <= results["texts"]["tokens_mean"] <= 64  # the tiny preset's max_length: 64
    for precision in ("fp32", "fp16"):
        rows = results["ceilings"][precision]
        assert [r["batch_size"] for r in rows] == [8, 32, 64]
        assert all(r["graph_texts_per_s"] > r["texts_per_s"] > 0 for r in rows)
        assert {r["provider"] for r in rows} == {"CPUExecutionProvider"}
    tokenizer = results["tokenizer"]
    assert {r["threads"] for r in tokenizer["all_cores"]} == {os.cpu_count()}
    assert [(r["threads"], r["batch_size"]) for r in tokenizer["one_at_a_time"]] == [(1, 1)]
    table = (out / "gpu_check.md").read_text()
    assert "| ratio | value | target | met |" in table and "| tokenizer | 1 thread, 1 text" in table
    if steps["perf_analyzer_setup"]["status"] != 0:
        assert not (TOOLS / "perf_analyzer").is_file(), "perf_analyzer is there but failed"
        assert {steps[name]["status"] for name in SERVED} == {"skipped"}
        pytest.skip("perf_analyzer could not be set up here: its steps were skipped")
    assert status == 0 and all(step["status"] == 0 for step in steps.values())
    servers = results["servers"]
    assert set(servers) == SERVED - {"cpu_workers"}
    assert all(s["texts_per_s"] > 0 and s["p99_ms"] >= s["p50_ms"] > 0 for s in servers.values())
    assert set(results["cpu_workers"]) == {"1", "2"}
    ratios = results["ratios"]
    assert set(ratios) == {
        "multi_over_tokenizer", "single_texts_per_s", "cpu_workers_gain",
        "shared_over_thread_1", "shared_over_thread_8",
    }  # fmt: skip
    assert all(ratio["value"] > 0 for ratio in ratios.values())


def test_the_gpu_check_refuses_to_run_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    if CUDA in available_providers():
        pytest.skip("this onnxruntime has CUDA: the check would run")
    assert gpu_check.main(["--output", "unused"]) == 2
    assert "offers no CUDA execution provider" in capsys.readouterr().err
