"""`textserve bench` against real servers: a tiny run of the whole benchmark on the exported
tiny model (every phase, half-second steps), and the OIP load path. Figures are checked for
presence and consistency only: tests never assert timings."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.serving import running_server
from textserve.bench.loadgen import closed_loop, open_loop
from textserve.bench.requests import build_requests, load_texts
from textserve.bench.runner import BenchConfig, run_benchmark


@pytest.mark.slow
def test_a_tiny_benchmark_runs_every_phase_against_real_servers(
    tiny_repository: Path, tiny_run: Path, tmp_path: Path
) -> None:
    from textserve.bench.report import write_results

    config = BenchConfig(
        repository=tiny_repository,
        model="tiny",
        concurrency=(1, 4),
        multi_texts_per_request=4,
        multi_concurrency=(2,),
        open_loop=(0.5,),
        warmup=0.2,
        duration=0.5,
        batching_off_concurrency=4,
        tracing_concurrency=4,
        trace_sample_ratio=1.0,
        intra_op_threads=1,
    )
    lines: list[str] = []
    results = run_benchmark(config, log=lines.append)

    steps = {(s["server"], s["mode"], s["concurrency"], s["texts_per_request"]): s
             for s in results["steps"]}  # fmt: skip
    assert set(steps) == {
        ("batching", "closed", 1, 1),
        ("batching", "closed", 4, 1),
        ("batching", "closed", 2, 4),
        ("batching", "open", None, 1),
        ("batching-off", "closed", 4, 1),
        ("tracing-off", "closed", 4, 1),
        ("tracing-100%", "closed", 4, 1),
        ("echo", "closed", results["loadgen_check"]["concurrency"], 1),
        ("trivial", "closed", results["loadgen_check"]["concurrency"], 1),
    }
    for key, step in steps.items():
        assert step["errors"] == {}, key
        assert step["requests"] > 0 and step["texts"] == step["requests"] * key[3], key
        lat = step["latency_ms"]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"] <= lat["max"], key
        srv = step["server_metrics"]  # the echo server's from /proc: it has no /metrics
        assert srv["texts"] > 0 and srv["cpu_seconds"] is not None, key
        if step["server"] != "echo":
            assert srv["cpu_per_text_ms"] > 0, key
    assert steps[("batching-off", "closed", 4, 1)]["server_metrics"]["mean_batch_size"] == 1.0
    assert results["machine"]["providers"]["tiny"] == "CPUExecutionProvider"
    # tracing on exported real spans to the sink, at least one per request
    tracing = results["tracing"]
    assert tracing["spans_received"] >= steps[("tracing-100%", "closed", 4, 1)]["requests"]
    assert set(tracing["p99_ms"]) == {"off", "on"}

    # ceilings ran at the batch sizes the server reached, PyTorch from the tiny run
    ort = results["ceilings"]["onnxruntime"]
    assert ort and all(c["texts"] > 0 and c["threads"] == 1 for c in ort.values())
    best = results["ceilings"]["onnxruntime_sorted"]
    assert set(best) == set(ort)
    # sorting by length can only cut padding
    assert all(best[k]["padding_ratio"] <= ort[k]["padding_ratio"] for k in ort)
    (torch_result,) = results["ceilings"]["torch"].values()
    assert torch_result["texts"] > 0, torch_result
    assert set(results["efficiency"]) == {"1", "4"}
    assert all(e["ratio"] > 0 and e["ratio_sorted"] > 0 for e in results["efficiency"].values())
    assert all(0 <= s["machine_cpu_share"] <= 1 for s in results["steps"])
    assert len(results["targets"]) == 7
    assert any("ceiling onnxruntime" in line for line in lines)

    written = write_results(results, tmp_path)
    data = json.loads(written["json"].read_text())
    assert data["model"]["name"] == "tiny" and data["model"]["model_config"]["d_model"] == 32


@pytest.mark.parametrize("api", ["v1", "oip", "http"])
def test_every_api_closed_and_open_loop(api: str, tiny_repository: Path, tiny_run: Path) -> None:
    pool = build_requests(load_texts(tiny_run), api, 3, "tiny", count=16)
    with running_server(tiny_repository, metrics_port=0) as server:
        address = server.address
        if api == "http":  # the HTTP port: /v1/classify
            address = f"127.0.0.1:{server.server.metrics_port}"
        raw, samples = asyncio.run(
            closed_loop(address, pool, 3, warmup=0.1, duration=0.4, probe=None)
        )
        assert raw.errors == {} and raw.requests_done > 0 and samples == []
        assert raw.texts == 3 * raw.requests_done
        raw, _ = asyncio.run(open_loop(address, pool, 40.0, warmup=0.1, duration=0.4))
        assert raw.errors == {} and raw.requests_done > 0
        # every arrival in the window, second by second (bench.overload's timeline)
        assert len(raw.outcomes) == len(raw.latencies) > 0
        assert all(0 <= at < 0.4 and took > 0 and code is None for at, took, code in raw.outcomes)


@pytest.mark.parametrize(("api", "code"), [("v1", "NOT_FOUND"), ("http", "HTTP_404")])
def test_errors_are_counted_by_status_code(
    api: str, code: str, tiny_repository: Path, tiny_run: Path
) -> None:
    pool = build_requests(load_texts(tiny_run), api, 1, "no-such-model", count=4)
    with running_server(tiny_repository, metrics_port=0) as server:
        address = server.address if api == "v1" else f"127.0.0.1:{server.server.metrics_port}"
        raw, _ = asyncio.run(closed_loop(address, pool, 2, warmup=0.0, duration=0.3))
        opened, _ = asyncio.run(open_loop(address, pool, 40.0, warmup=0.0, duration=0.3))
    assert raw.requests_done == 0 and raw.latencies == []
    assert set(raw.errors) == {code} and raw.errors[code] > 0
    # how fast each error came, by code (the open loop's from the scheduled arrival)
    assert len(raw.error_latencies[code]) == raw.errors[code]
    assert len(opened.error_latencies[code]) == opened.errors[code] > 0
    assert [c for _, _, c in opened.outcomes] == [code] * opened.errors[code]


@pytest.mark.slow
def test_the_stream_mode_measures_streams_and_unary_side_by_side(
    tiny_repository: Path, tiny_run: Path
) -> None:
    from textserve.bench.report import format_table

    config = BenchConfig(
        repository=tiny_repository,
        model="tiny",
        api="stream",
        concurrency=(8,),
        streams=2,
        unary_concurrency=(4,),
        multi_texts_per_request=0,
        open_loop=(),
        warmup=0.2,
        duration=0.5,
        batching_off_concurrency=0,
        tracing_concurrency=0,  # the tracing steps have their own test
        intra_op_threads=1,
        torch=False,
    )
    results = run_benchmark(config, log=lambda line: None)
    steps = {s["server"]: s for s in results["steps"]}
    assert set(steps) == {"batching", "unary", "echo", "echo-unary", "trivial"}
    for name, step in steps.items():
        assert step["errors"] == {} and step["texts"] > 0, name
        assert step["server_metrics"]["cpu_seconds"] is not None, name
    for name in ("batching", "echo", "trivial"):  # 2 streams x 4 messages in flight
        assert (steps[name]["streams"], steps[name]["inflight_per_stream"]) == (2, 4), name
    assert "streams" not in steps["unary"] and steps["unary"]["concurrency"] == 4
    assert steps["batching"]["server_metrics"]["cpu_per_text_ms"] > 0
    assert set(results["efficiency"]) == {"1"} and set(results["efficiency_unary"]) == {"1"}
    assert results["loadgen_check"]["echo_unary_cpu_per_text_ms"] is not None
    table = format_table(results)
    assert "stream 2x4" in table and "efficiency of stream" in table
    assert "efficiency of unary" in table and "echo over unary calls" in table


@pytest.mark.slow
def test_the_field_bench_runs_its_four_steps(tiny_run: Path, tmp_path: Path) -> None:
    """bench/field.py end to end on a short run: every step answered without errors, the
    summary ratios present (never asserted as timings)."""
    from textserve.bench import field

    code = field.main(
        ["--texts", str(tiny_run), "--duration", "0.5", "--warmup", "0.2", "--rounds", "1",
         "--concurrency", "2", "--output", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "field.json").read_text())
    assert set(report["steps"]) == set(field.pools(["a text"], 1))
    for label, step in report["steps"].items():
        assert step["errors"] == 0 and step["documents_per_s"] > 0, label
    assert report["summary"]["windows_per_document"] > 1
