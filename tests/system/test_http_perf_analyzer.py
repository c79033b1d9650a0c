"""NVIDIA's perf_analyzer over HTTP (`-i http`, KServe v2 REST with its binary extension,
unchanged defaults) against the same server as over gRPC: `textserve.bench.perf_analyzer
--http` reports both protocols at each level."""

from __future__ import annotations

import json
from pathlib import Path

from tests.serving import ROOT
from textserve.bench.perf_analyzer import ensure_perf_analyzer, main

TOOLS = ROOT / ".tools" / "perf_analyzer"


def test_perf_analyzer_drives_http_beside_grpc(
    tiny_repository: Path, tiny_run: Path, tmp_path: Path
) -> None:
    ensure_perf_analyzer(TOOLS)  # idempotent; see tests/system/test_perf_analyzer.py
    # --stability 1000: what is checked is that both protocols run, not how steady a busy
    # shared machine is (at 100 a window of a loaded CI machine could fail the level)
    status = main(
        [
            *("--repository", str(tiny_repository), "--model", "tiny", "--http"),
            *("--server-args", "--intra-op-threads 1"),
            *("--texts", str(tiny_run / "test.jsonl"), "--num-texts", "50"),
            *("--concurrency", "1,4", "--request-count", "40", "--stability", "1000"),
            *("--output", str(tmp_path), "--tools", str(TOOLS), "--level-timeout", "120"),
        ]
    )
    assert status == 0, (tmp_path / "perf_analyzer_server.log").read_text()
    result = json.loads((tmp_path / "perf_analyzer.json").read_text())
    for protocol in ("textserve", "http"):
        levels = result[protocol]
        assert [r["concurrency"] for r in levels] == [1, 4], protocol
        assert all(r["throughput"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0 for r in levels)
