"""NVIDIA's perf_analyzer (the real C++ binary, set up by bench/perf_analyzer.py) drives
textserve over the Open Inference Protocol with real texts and reports per-level figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.serving import ROOT
from textserve.bench.perf_analyzer import ensure_perf_analyzer, main

TOOLS = ROOT / ".tools" / "perf_analyzer"


@pytest.fixture(scope="module")
def perf_analyzer() -> Path:
    # Idempotent: downloads the tritonclient 2.51.0 wheel's binary and libcudart the first
    # time (pip download, ~17 MB), installs libb64 with apt-get if it is missing.
    return ensure_perf_analyzer(TOOLS)


def test_perf_analyzer_reports_every_concurrency_level(
    perf_analyzer: Path,
    tiny_repository: Path,
    tiny_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The `make bench` path: the script starts `textserve serve` itself, then sweeps."""
    model = "tiny"
    stale = tmp_path / "perf_analyzer_r999.9.csv"  # a level of an earlier run into this folder
    stale.write_text("old\n")
    status = main(
        [
            *("--repository", str(tiny_repository), "--model", model),
            *("--server-args", "--intra-op-threads 1"),
            *("--texts", str(tiny_run / "test.jsonl"), "--num-texts", "50"),
            *("--concurrency", "1,2", "--request-rates", "half-peak", "--request-count", "40"),
            # Stability is not what this test checks; a busy CI machine must not fail it.
            *("--stability", "100", "--output", str(tmp_path), "--tools", str(TOOLS)),
            *("--level-timeout", "120", "--floor"),
        ]
    )
    assert status == 0, (tmp_path / "perf_analyzer_server.log").read_text()
    result = json.loads((tmp_path / "perf_analyzer.json").read_text())
    reports = result["textserve"]
    closed, (open_loop,) = reports[:2], reports[2:]
    assert [r["concurrency"] for r in closed] == [1, 2]
    # The open-loop level runs Poisson arrivals at half the sweep's best throughput.
    peak = max(r["throughput"] for r in closed)
    assert open_loop["request_rate"] == pytest.approx(peak / 2, abs=0.1)
    ratio = open_loop["p99_ms"] / closed[0]["p50_ms"]
    out = capsys.readouterr().out
    assert "textserve: p99 at " in out and f"= {ratio:.1f}x" in out
    # --floor: the model-less echo server at one caller and the same Poisson rate
    echo_one, echo_rate = result["echo"]
    assert echo_one["concurrency"] == 1
    assert echo_rate["request_rate"] == open_loop["request_rate"]
    assert echo_rate["throughput"] > 0 and 0 < echo_one["p50_ms"] <= echo_one["p99_ms"]
    floor = echo_rate["p99_ms"] / echo_one["p50_ms"]
    assert "echo: p99 at " in out and f"= {floor:.1f}x" in out
    for report in reports:
        assert report["throughput"] > 0
        assert 0 < report["p50_ms"] <= report["p90_ms"] <= report["p95_ms"] <= report["p99_ms"]
        # Read by perf_analyzer from ModelStatistics: the server-side split is there.
        assert report["server_compute_infer_ms"] > 0
    sent = json.loads((tmp_path / "perf_analyzer_input.json").read_text())["data"]
    assert len(sent) == 50 and all(d["TEXT"]["shape"] == [1] for d in sent)
    # The folder holds this run's levels only.
    rate = f"r{open_loop['request_rate']:g}"
    assert sorted(p.name for p in tmp_path.glob("perf_analyzer_*.csv")) == [
        "perf_analyzer_c1.csv",
        "perf_analyzer_c2.csv",
        "perf_analyzer_echo_c1.csv",
        f"perf_analyzer_echo_{rate}.csv",
        f"perf_analyzer_{rate}.csv",
    ]
    # The server it started drained and stopped by itself.
    assert "stopped after" in (tmp_path / "perf_analyzer_server.log").read_text()


def test_perf_analyzer_compares_worker_counts_one_server_each(
    perf_analyzer: Path,
    tiny_repository: Path,
    tiny_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--workers 1,2`: a server per count in turn, the same levels against each, and a line
    comparing each count with the first (the scale-up benchmark with a C++ load generator)."""
    status = main(
        [
            *("--repository", str(tiny_repository), "--model", "tiny"),
            *("--server-args", "--intra-op-threads 1", "--workers", "1,2"),
            *("--texts", str(tiny_run / "test.jsonl"), "--num-texts", "50"),
            *("--concurrency", "4", "--request-count", "40", "--stability", "100"),
            *("--output", str(tmp_path), "--tools", str(TOOLS), "--level-timeout", "120"),
        ]
    )
    assert status == 0, (tmp_path / "perf_analyzer_server_w2.log").read_text()
    result = json.loads((tmp_path / "perf_analyzer.json").read_text())
    one, two = result["workers"]["1"], result["workers"]["2"]
    assert result["textserve"] == one
    assert [r["concurrency"] for r in one] == [r["concurrency"] for r in two] == [4]
    ratio = two[0]["throughput"] / one[0]["throughput"]
    out = capsys.readouterr().out
    assert "c=4: --workers 2 / --workers 1 = " in out and f"= {ratio:.2f}x; p99 " in out
    # each count had a server of its own, with that many workers, stopped at the end
    log_one = (tmp_path / "perf_analyzer_server_w1.log").read_text()
    log_two = (tmp_path / "perf_analyzer_server_w2.log").read_text()
    assert "2 workers serving" in log_two and "workers serving" not in log_one
    assert "stopped after" in log_one and log_two.count("stopped after") == 2  # each worker
    assert sorted(p.name for p in tmp_path.glob("perf_analyzer_*.csv")) == [
        "perf_analyzer_w1_c4.csv",
        "perf_analyzer_w2_c4.csv",
    ]


def test_a_level_that_never_stabilizes_is_marked_and_the_sweep_goes_on(
    perf_analyzer: Path,
    tiny_repository: Path,
    tiny_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A noisy machine, made certain: with --stability 0 no two windows ever agree, so the
    real binary exits 2 with "Failed to obtain stable measurement" at every level. The sweep
    measures again with longer windows, then without the check, and reports the level,
    marked unstable with their windows' spread, instead of failing `make bench`."""
    status = main(
        [
            *("--repository", str(tiny_repository), "--model", "tiny"),
            *("--server-args", "--intra-op-threads 1"),
            *("--texts", str(tiny_run / "test.jsonl"), "--num-texts", "50"),
            *("--concurrency", "2", "--request-count", "10", "--stability", "0"),
            *("--output", str(tmp_path), "--tools", str(TOOLS), "--level-timeout", "120"),
        ]
    )
    assert status == 0, (tmp_path / "perf_analyzer_server.log").read_text()
    reports = json.loads((tmp_path / "perf_analyzer.json").read_text())["textserve"]
    assert [r["concurrency"] for r in reports] == [2]
    out = capsys.readouterr().out
    for report in reports:
        assert report["throughput"] > 0 and report["spread_pct"] > 0 and report["windows"] >= 3
        level = f"c{report['concurrency']:.0f}"
        assert f"UNSTABLE {level}: throughput varied by" in out
        assert f"| c={report['concurrency']:.0f} **unstable** (windows ±" in out
