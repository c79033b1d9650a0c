"""Unit tests of the prepared GPU check's parts (bench/gpu_check_steps.py, gpu_check_report.py):
NVML sampling with and without pynvml, the time budget, a step past its time, the ratios of
issue 37 and the Markdown table. The check itself runs dry in tests/integration/test_gpu_path.py.
"""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from textserve.bench import gpu_check, gpu_check_steps
from textserve.bench.gpu_check_report import format_table, ratios
from textserve.bench.gpu_check_steps import GpuSampler, Steps, run_command, summarize_samples


def fake_pynvml(utilization: list[int]) -> Any:
    """A pynvml whose GPU reports `utilization` in turn (then its last value), 1 GiB used."""
    readings = iter(utilization)
    last = [0]

    def rates(handle: object) -> Any:
        last[0] = next(readings, last[0])
        return types.SimpleNamespace(gpu=last[0], memory=0)

    return types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda index: object(),
        nvmlDeviceGetUtilizationRates=rates,
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=2**30),
    )


def test_the_gpu_is_sampled_while_a_step_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([0, 0, 80, 100, 60, 0]))
    sampler = GpuSampler(interval=0.01)
    assert sampler.reason is None
    with sampler.sample() as figures:
        time.sleep(0.3)
    assert figures["samples"] >= 6 and figures["util_max"] == 100
    assert figures["memory_max_mib"] == 1024
    assert figures["util_busy_mean"] == 80.0  # 80, 100, 60: the start and the end left out
    assert figures["util_mean"] < figures["util_busy_mean"]


def test_without_pynvml_the_figures_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    sampler = GpuSampler()
    with sampler.sample() as figures:
        pass
    assert figures == {"unavailable": "pynvml is not installed (the nvidia-ml-py package)"}


def test_an_idle_step_has_no_busy_stretch() -> None:
    assert summarize_samples([(0.0, 10.0), (0.0, 12.0)])["util_busy_mean"] == 0.0
    assert summarize_samples([]) == {"samples": 0}


def test_a_step_past_its_time_is_stopped_with_its_children(tmp_path: Path) -> None:
    started = time.monotonic()
    record = run_command(["sh", "-c", "sleep 30 & sleep 30"], tmp_path / "slow.log", 0.5)
    assert record["status"] == 124 and time.monotonic() - started < 10


def test_steps_share_one_budget_and_record_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = Steps(tmp_path, budget=60)
    assert steps.run("ok", ["true"], 10) and not steps.run("fails", ["false"], 10)
    assert not steps.run("blocked", ["true"], 10, blocked="no tool")
    assert steps.call("raises", lambda: 1 / 0) is None
    monkeypatch.setattr(gpu_check_steps, "MIN_STEP_SECONDS", 61.0)
    assert not steps.run("late", ["true"], 10)
    records = steps.records
    assert [records[n]["status"] for n in ("ok", "fails", "raises")] == [0, 1, 1]
    assert records["blocked"] == {"status": "skipped", "reason": "skipped: no tool"}
    assert records["late"]["status"] == "skipped" and "time budget" in records["late"]["reason"]
    assert "ZeroDivisionError" in records["raises"]["error"]


def server(workers: int, engine: str, per_request: int, rate: float) -> dict[str, Any]:
    return {
        "device": "cuda", "precision": "fp16", "workers": workers, "engine": engine,
        "texts_per_request": per_request, "callers": 32, "texts_per_s": rate,
        "p50_ms": 2.0, "p99_ms": 5.0, "server_queue_ms": 0.5, "server_infer_ms": 1.0,
    }  # fmt: skip


def tokenized(threads: int, batch: int, rate: float) -> dict[str, Any]:
    return {
        "threads": threads,
        "batch_size": batch,
        "texts_per_second": rate,
        "tokens_per_text": 120,
    }


def cpu(rate: float) -> dict[str, Any]:
    return {"precision": "fp32", "callers": 128, "texts_per_s": rate, "p50_ms": 9.0, "p99_ms": 30.0}


def test_the_acceptance_ratios_and_the_table() -> None:
    results: dict[str, Any] = {
        "servers": {
            "a": server(1, "thread", 1, 9_000),
            "b": server(8, "thread", 1, 14_000),
            "c": server(8, "shared", 1, 16_000),
            "d": server(8, "thread", 64, 60_000),
            "e": server(8, "shared", 64, 90_000),
        },
        "tokenizer": {"all_cores": [tokenized(16, 512, 100_000.0), tokenized(16, 64, 80_000.0)]},
        "cpu_workers": {"1": cpu(500.0), "8": cpu(2_600.0)},
        "steps": {"c": {"status": 0, "seconds": 20.0, "gpu": {"util_busy_mean": 71.5}}},
    }
    found = ratios(results)
    assert found["multi_over_tokenizer"]["value"] == pytest.approx(0.9)
    assert found["multi_over_tokenizer"]["met"] is True
    assert found["single_texts_per_s"]["value"] == 16_000 and found["single_texts_per_s"]["met"]
    assert found["cpu_workers_gain"]["value"] == pytest.approx(5.2)
    assert found["shared_over_thread_64"]["value"] == pytest.approx(1.5)
    assert found["shared_over_thread_1"]["met"] is None  # a comparison, no target
    results["ratios"] = found
    table = format_table(results)
    assert "| --workers 8 --engine shared, 1 text/request, 32 callers | 16,000 |" in table
    assert "| 72 |" in table  # the GPU's busy share during that step
    assert "| CPU provider --workers 8 / --workers 1 | 5.20 | ≥ 5.00 | yes |" in table


def test_ratios_whose_steps_did_not_run_are_none() -> None:
    found = ratios({"steps": {}})
    assert {r["value"] for r in found.values()} == {None}
    assert set(found) == {"multi_over_tokenizer", "single_texts_per_s", "cpu_workers_gain"}


def test_on_the_gpu_machine_perf_analyzer_is_never_downloaded(tmp_path: Path) -> None:
    """No package index there: a tools folder without the binary is a skipped step."""
    steps = Steps(tmp_path, budget=60)
    assert not gpu_check._perf_analyzer(gpu_check.GPU, tmp_path / "none", sys.executable, steps)
    reason = steps.records["perf_analyzer_setup"]["reason"]
    assert "lacks perf_analyzer, libcudart.so.12" in reason and "carry .tools/" in reason
    assert not (tmp_path / "none").exists()


def test_models_must_hold_an_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main(["--dry-run", "--models", str(tmp_path), "--output", "unused"]) == 2
    assert "holds no complete tiny_fp16 or tiny_fp32 version" in capsys.readouterr().err
