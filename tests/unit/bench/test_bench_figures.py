"""The pure parts of `textserve bench`: percentiles, the Poisson schedule, metrics parsing,
request building, step summaries, targets and the report files. No server, no timing."""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from textserve.bench.loadgen import poisson_arrivals
from textserve.bench.report import evaluate_targets, format_table, write_results
from textserve.bench.requests import (
    BenchInputError,
    build_requests,
    load_texts,
    sample_batches,
)
from textserve.bench.scrape import parse_sample, process_cpu_seconds, server_delta
from textserve.bench.stats import RawStep, parse_proc_stat, percentiles, summarize

# -- percentiles ---------------------------------------------------------------------------


def test_percentiles_are_nearest_rank_values_that_happened() -> None:
    values = list(range(1, 101))  # 1..100
    got = percentiles(values, (50, 90, 99, 100))
    assert got == {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p100": 100.0, "max": 100.0}
    assert percentiles([7.0], (50, 99)) == {"p50": 7.0, "p99": 7.0, "max": 7.0}


def test_percentiles_ignore_input_order() -> None:
    rng = np.random.default_rng(1)
    values = rng.exponential(size=1001)
    assert percentiles(values) == percentiles(np.sort(values)[::-1])


def test_percentiles_of_nothing_are_nan_and_bad_quantiles_refused() -> None:
    assert all(math.isnan(v) for v in percentiles([]).values())
    with pytest.raises(ValueError, match="0-100"):
        percentiles([1.0], (101,))


# -- Poisson schedule ------------------------------------------------------------------------


def test_poisson_arrivals_are_sorted_inside_the_window_at_the_rate() -> None:
    times = poisson_arrivals(500.0, 20.0, np.random.default_rng(0))
    assert np.all(np.diff(times) > 0) and times[0] >= 0 and times[-1] < 20.0
    # 10,000 expected; the count of a Poisson process has sd 100: 5 sd either side
    assert 9500 < len(times) < 10500
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / 500, rel=0.05)
    # exponential gaps: the sd equals the mean (a fixed schedule would have sd 0)
    assert gaps.std() == pytest.approx(gaps.mean(), rel=0.1)


def test_poisson_arrivals_are_reproducible_and_refuse_nonsense() -> None:
    a = poisson_arrivals(50.0, 3.0, np.random.default_rng(7))
    b = poisson_arrivals(50.0, 3.0, np.random.default_rng(7))
    assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="positive"):
        poisson_arrivals(0.0, 1.0, np.random.default_rng(0))


def test_poisson_arrivals_cover_the_window_when_the_first_draw_falls_short() -> None:
    times = poisson_arrivals(0.5, 200.0, np.random.default_rng(3))  # few, long gaps
    assert times[-1] < 200.0 and len(times) > 50


# -- metrics parsing ---------------------------------------------------------------------------

METRICS = """\
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total {cpu}
# HELP textserve_batch_size Items (texts) per batch sent to the model
# TYPE textserve_batch_size histogram
textserve_batch_size_bucket{{le="1.0",model="a"}} 0.0
textserve_batch_size_bucket{{le="+Inf",model="a"}} {batches}
textserve_batch_size_count{{model="a"}} {batches}
textserve_batch_size_sum{{model="a"}} {items}
textserve_batch_size_count{{model="b"}} 1000.0
textserve_batch_size_sum{{model="b"}} 9000.0
# HELP textserve_batch_padding_ratio Fraction of padding
# TYPE textserve_batch_padding_ratio histogram
textserve_batch_padding_ratio_count{{model="a"}} {batches}
textserve_batch_padding_ratio_sum{{model="a"}} {padding}
# HELP textserve_model_info 1 for the version being served
# TYPE textserve_model_info gauge
textserve_model_info{{model="a",provider="CPUExecutionProvider",version="3"}} 1.0
"""


def _metrics(cpu: float, batches: float, items: float, padding: float) -> str:
    return METRICS.format(cpu=cpu, batches=batches, items=items, padding=padding)


def test_parse_sample_reads_cpu_batches_padding_and_provider_per_model() -> None:
    sample = parse_sample(_metrics(12.5, 10, 80, 2.5), model="a", at=1.0)
    assert sample.cpu_seconds == 12.5
    assert (sample.batches, sample.items, sample.padding_sum) == (10, 80, 2.5)
    assert sample.providers == {"a": "CPUExecutionProvider"}
    every = parse_sample(_metrics(12.5, 10, 80, 2.5), at=1.0)
    assert (every.batches, every.items) == (1010, 9080)


def test_server_delta_divides_cpu_by_the_texts_of_the_same_interval() -> None:
    before = parse_sample(_metrics(10.0, 100, 800, 20.0), model="a", at=100.0)
    after = parse_sample(_metrics(13.0, 300, 2800, 60.0), model="a", at=102.0)
    delta = server_delta(before, after, cpus=2)
    assert delta["texts"] == 2000 and delta["batches"] == 200
    assert delta["mean_batch_size"] == 10.0
    assert delta["padding_ratio"] == pytest.approx(0.2)
    assert delta["cpu_seconds"] == pytest.approx(3.0)
    assert delta["cpu_per_text_ms"] == pytest.approx(1.5)
    assert delta["cpu_share"] == pytest.approx(0.75)  # 3 s of CPU in 2 s on 2 cores


def test_server_delta_without_traffic_or_cpu_gives_none_not_a_division_error() -> None:
    idle = parse_sample(_metrics(1.0, 5, 5, 0.0), model="a", at=0.0)
    delta = server_delta(idle, idle, cpus=2)
    assert delta["mean_batch_size"] is None and delta["cpu_per_text_ms"] is None
    no_cpu = parse_sample("", at=0.0)
    assert no_cpu.cpu_seconds is None
    assert server_delta(no_cpu, no_cpu, cpus=2)["cpu_seconds"] is None


def test_process_cpu_seconds_of_this_process_and_of_none() -> None:
    import os

    mine = process_cpu_seconds(os.getpid())
    assert mine is not None and mine > 0  # importing numpy alone takes CPU
    assert process_cpu_seconds(2**22 + 12345) is None  # above Linux's pid_max


def test_parse_proc_stat_counts_idle_and_iowait_as_not_busy() -> None:
    text = "cpu  10 2 3 80 5 0 0 0 0 0\ncpu0 5 1 1 40 2 0 0 0 0 0\n"
    assert parse_proc_stat(text) == (15, 100)
    with pytest.raises(ValueError, match="/proc/stat"):
        parse_proc_stat("intr 1 2 3")


# -- texts and requests -------------------------------------------------------------------------


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    return path


def test_load_texts_from_a_run_dir_skips_blank_texts(tmp_path: Path) -> None:
    _jsonl(tmp_path / "test.jsonl", [{"text": "a fine film", "label": "fresh"}, {"text": "  "}])
    assert load_texts(tmp_path) == ["a fine film"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json\n", r"x\.jsonl:1: not JSON"),
        ('{"label": 1}\n', r"x\.jsonl:1: no string field 'text'"),
        ('{"text": " "}\n', "holds no non-empty texts"),
    ],
)
def test_load_texts_says_what_is_wrong(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "x.jsonl").write_text(content)
    with pytest.raises(BenchInputError, match=message):
        load_texts(tmp_path / "x.jsonl")


def test_load_texts_names_the_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BenchInputError, match=r"no texts at .*test\.jsonl: pass --texts"):
        load_texts(tmp_path)


def test_sample_batches_use_every_text_before_repeating_one() -> None:
    texts = [f"t{i}" for i in range(10)]
    batches = sample_batches(texts, 3, 4)
    assert [len(b) for b in batches] == [3, 3, 3, 3]
    flat = [t for b in batches for t in b]
    assert sorted(flat[:10]) == sorted(texts)
    with pytest.raises(BenchInputError, match="at least 1"):
        sample_batches(texts, 0, 1)


def test_v1_requests_carry_the_texts_and_model() -> None:
    from textserve.v1 import classifier_pb2 as pb

    pool = build_requests(["one", "two", "three"], "v1", 2, "m", count=5)
    assert pool.method == "/textserve.v1.Classifier/Classify" and len(pool.payloads) == 5
    request = pb.ClassifyRequest.FromString(pool.payloads[0])
    assert request.model == "m" and len(request.texts) == 2
    assert set(request.texts) <= {"one", "two", "three"}


def test_oip_requests_decode_with_the_servers_own_codec() -> None:
    from textserve.oip import grpc_service_pb2 as oip
    from textserve.service.dataplane.oip_codec import decode_request

    texts = ["caf\u00e9 society", "a long, slow film", "ok"]
    pool = build_requests(texts, "oip", 3, "default", count=2)
    assert pool.method == "/inference.GRPCInferenceService/ModelInfer"
    request = oip.ModelInferRequest.FromString(pool.payloads[0])
    assert request.model_name == "default"
    decoded = decode_request(request)
    assert sorted(decoded.texts) == sorted(texts) and decoded.raw


def test_build_requests_refuses_an_unknown_api() -> None:
    with pytest.raises(BenchInputError, match="--api must be one of v1, oip"):
        build_requests(["a"], "rest", 1, "m")


# -- summaries, targets, report -------------------------------------------------------------------


def test_summarize_gives_throughput_latency_errors_and_loadgen_share() -> None:
    raw = RawStep(
        latencies=[0.010, 0.020, 0.030, 0.040],
        requests_done=4,
        texts=64,
        errors=Counter({"RESOURCE_EXHAUSTED": 2}),
        window_seconds=2.0,
        loadgen_cpu_seconds=0.5,
    )
    s = summarize(raw, cpus=2)
    assert s["throughput_requests_per_s"] == 2.0 and s["throughput_texts_per_s"] == 32.0
    assert s["latency_ms"]["p50"] == pytest.approx(20.0)
    assert s["latency_ms"]["max"] == pytest.approx(40.0)
    assert s["errors"] == {"RESOURCE_EXHAUSTED": 2}
    assert s["loadgen"]["cpu_share"] == pytest.approx(0.125)
    with pytest.raises(ValueError, match="window"):
        summarize(RawStep(), cpus=2)


def test_rawstep_merge_adds_up_two_processes_shares() -> None:
    a = RawStep([0.1], 1, 1, Counter({"UNAVAILABLE": 1}), 5.0, 0.2)
    a.merge(RawStep([0.2, 0.3], 2, 2, Counter({"UNAVAILABLE": 2}), 5.1, 0.3, not_sent=1))
    assert (a.requests_done, a.texts, a.errors["UNAVAILABLE"]) == (3, 3, 3)
    assert (a.window_seconds, a.loadgen_cpu_seconds, a.not_sent) == (5.1, 0.5, 1)


def _step(server: str, concurrency: int | None, tps: float, p50: float, p99: float, **kw: object):
    step = {
        "server": server,
        "mode": "closed" if concurrency else "open",
        "api": "v1",
        "concurrency": concurrency,
        "rate_requests_per_s": kw.get("rate"),
        "texts_per_request": kw.get("per_request", 1),
        "requests": 100,
        "texts": 100,
        "window_s": 1.0,
        "throughput_requests_per_s": tps / kw.get("per_request", 1),  # type: ignore[operator]
        "throughput_texts_per_s": tps,
        "latency_ms": {"p50": p50, "p90": p99, "p95": p99, "p99": p99, "max": p99, "mean": p50},
        "errors": {},
        "not_sent": 0,
        "loadgen": {"cpu_seconds": 0.1, "cpu_share": 0.05},
        "server_metrics": {
            "mean_batch_size": 8.0,
            "padding_ratio": 0.1,
            "cpu_share": 0.9,
            "cpu_per_text_ms": 1.0,
        },
    }
    return step


def _results() -> dict:
    return {
        "steps": [
            _step("batching", 1, 200, 5.0, 8.0),
            _step("batching", 64, 1100, 50.0, 90.0),
            _step("batching", 128, 1200, 90.0, 140.0),
            _step("batching", None, 590, 7.0, 14.0, rate=600.0),
            _step("batching-off", 64, 300, 200.0, 260.0),
        ],
        "efficiency": {"1": {"ratio": 0.7, "concurrency": 128, "batch_size": 8,
                             "server_cpu_per_text_ms": 1.0, "inprocess_cpu_per_text_ms": 0.7}},
        "loadgen_check": {"concurrency": 128, "echo_texts_per_s": 3000.0, "headroom": 2.5,
                          "real_peak_texts_per_s": 1200.0, "trivial_texts_per_s": 1500.0},
        "ceilings": {"onnxruntime": {"8": {"threads": 2, "texts_per_s": 2000.0,
                                           "cpu_per_text_ms": 0.7, "padding_ratio": 0.3}},
                     "torch": {"8": {"skipped": "PyTorch is not installed"}}},
        "machine": {"usable_cpus": 2, "cpu_model": "x", "versions": {"onnxruntime": "1"}},
    }  # fmt: skip


def test_evaluate_targets_marks_pass_miss_and_not_measured() -> None:
    targets = {t["name"]: t for t in evaluate_targets(_results())}
    assert targets["texts/s at 128 callers (1 text/request)"]["ok"] is True
    assert targets["p99 latency at 128 callers"]["ok"] is True
    gain = targets["batching on / off at 64 callers"]
    assert gain["value"] == pytest.approx(1100 / 300) and gain["ok"] is True
    half = targets["p99 at half the peak rate / p50 at 1 caller"]
    assert half["value"] == pytest.approx(14.0 / 5.0) and half["ok"] is True
    assert targets["CPU efficiency in-process / server, 1 text(s)/request"]["ok"] is False
    sixteen = targets["CPU efficiency in-process / server, 16 text(s)/request"]
    assert sixteen["value"] is None and sixteen["ok"] is None
    assert targets["load generator headroom: echo server / real peak"]["ok"] is True


def test_evaluate_targets_of_an_empty_run_measures_nothing() -> None:
    assert all(t["ok"] is None for t in evaluate_targets({"steps": []}))


def test_report_files_hold_every_figure(tmp_path: Path) -> None:
    results = _results()
    results["steps"][0]["latency_ms"]["p99"] = float("nan")
    results["targets"] = evaluate_targets(results)
    table = format_table(results)
    assert "closed c=128" in table and "open 600/s" in table and "batching-off" in table
    assert "[MISS] CPU efficiency" in table and "skipped (PyTorch is not installed)" in table
    written = write_results(results, tmp_path / "out")
    data = json.loads(written["json"].read_text())  # NaN written as null: strict JSON
    assert data["steps"][0]["latency_ms"]["p99"] is None
    assert data["loadgen_check"]["headroom"] == 2.5
    assert written["table"].read_text().strip() == table
    if "plot" in written:  # matplotlib installed (textserve[bench])
        assert written["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the CLI's flags ---------------------------------------------------------------------------


def _parse(*argv: str) -> argparse.Namespace:
    from textserve.bench import cli as bench_cli

    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_flags_become_the_config() -> None:
    from textserve.bench import cli as bench_cli

    args = _parse("--concurrency", "2,8", "--open-loop", "0.5", "--server-args",
                  "--max-queue-delay-ms 5", "--api", "oip")  # fmt: skip
    config = bench_cli.build_config(args)
    assert config.concurrency == (2, 8) and config.open_loop == (0.5,)  # type: ignore[attr-defined]
    assert config.server_args == ("--max-queue-delay-ms", "5")  # type: ignore[attr-defined]
    assert config.api == "oip"  # type: ignore[attr-defined]


@pytest.mark.parametrize("argv", [["--concurrency", "0"], ["--concurrency", "a,b"],
                                  ["--open-loop", "-1"], ["--api", "rest"]])  # fmt: skip
def test_cli_refuses_bad_lists(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(*argv)
    assert "error" in capsys.readouterr().err


def test_cli_refuses_bad_numbers() -> None:
    from textserve.bench import cli as bench_cli
    from textserve.cli import CliError

    with pytest.raises(CliError, match="--texts-per-request must be at least 1"):
        bench_cli.build_config(_parse("--texts-per-request", "0"))
    with pytest.raises(CliError, match="--duration"):
        bench_cli.build_config(_parse("--duration", "0"))


def test_cli_without_a_model_says_how_to_get_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from textserve.cli import main

    status = main(["bench", "--repository", str(tmp_path), "--output", str(tmp_path / "out")])
    assert status == 2
    err = capsys.readouterr().err
    assert "no complete version of model 'default'" in err and "make serve" in err
    assert not (tmp_path / "out").exists()
