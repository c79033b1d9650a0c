"""Unit tests of bench/perf_analyzer.py's pure parts: texts in, command line, CSV report out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from textserve.bench.perf_analyzer import (
    format_table,
    load_texts,
    main,
    parse_report,
    perf_analyzer_command,
    tail_ratio,
    workers_comparison,
    write_input_data,
)

# The header and a row exactly as perf_analyzer 2.51.0 writes them with -f (µs).
CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
    "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
    "p50 latency,p90 latency,p95 latency,p99 latency\n"
    "2,1273.4,12,2025,2118,2771,5599,0,5,11411,15499,18038,32637\n"
)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        (
            "texts.jsonl",
            '{"text": "good film", "label": "fresh"}\n\n{"text": "  "}\n{"text": "bad"}\n',
        ),
        ("texts.csv", 'text,label\n"good film",fresh\n"  ",rotten\nbad,rotten\n'),
        ("texts.txt", "good film\n\nbad\n"),
    ],
)
def test_texts_come_from_jsonl_csv_or_lines(tmp_path: Path, name: str, content: str) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    assert load_texts(path, limit=10) == ["good film", "bad"]
    assert load_texts(path, limit=1) == ["good film"]


def test_a_file_without_texts_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no texts"):
        load_texts(path, limit=10)


def test_input_data_has_one_text_tensor_per_text(tmp_path: Path) -> None:
    path = write_input_data(["héllo", "b"], tmp_path / "in.json")
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "data": [
            {"TEXT": {"content": ["héllo"], "shape": [1]}},
            {"TEXT": {"content": ["b"], "shape": [1]}},
        ]
    }


def test_command_counts_windows_and_stabilizes_on_a_percentile_only_if_asked() -> None:
    common = {
        "url": "127.0.0.1:1",
        "model": "m",
        "concurrency": 4,
        "input_data": Path("in.json"),
        "csv_path": Path("out.csv"),
        "request_count": 300,
    }
    command = perf_analyzer_command(Path("pa"), **common)  # type: ignore[arg-type]
    joined = " ".join(command)
    assert "-i grpc" in joined and "--concurrency-range 4:4" in joined
    assert "--measurement-mode count_windows --measurement-request-count 300" in joined
    assert "--percentile" not in command
    with_p95 = perf_analyzer_command(Path("pa"), percentile=95, **common)  # type: ignore[arg-type]
    assert with_p95[-2:] == ["--percentile", "95"]


def test_report_is_in_milliseconds_and_tabulates(tmp_path: Path) -> None:
    path = tmp_path / "c2.csv"
    path.write_text(CSV, encoding="utf-8")
    report = parse_report(path)
    assert report["concurrency"] == 2 and report["throughput"] == pytest.approx(1273.4)
    assert (report["p50_ms"], report["p99_ms"]) == pytest.approx((11.411, 32.637))
    assert report["server_compute_infer_ms"] == pytest.approx(5.599)
    table = format_table([report])
    assert table.splitlines()[2] == "| c=2 | 1273.4 | 11.41 | 15.50 | 18.04 | 32.64 | 2.12 | 5.60 |"


def test_a_request_rate_runs_poisson_arrivals_and_is_compared_with_one_caller(
    tmp_path: Path,
) -> None:
    command = perf_analyzer_command(
        Path("pa"),
        url="127.0.0.1:1",
        model="m",
        request_rate=560.5,
        input_data=Path("in.json"),
        csv_path=Path("out.csv"),
        request_count=300,
    )
    joined = " ".join(command)
    assert "--request-rate-range 560.5:560.5 --request-distribution poisson" in joined
    assert "--concurrency-range" not in joined
    with pytest.raises(ValueError, match="exactly one"):
        perf_analyzer_command(
            Path("pa"), url="u", model="m", concurrency=1, request_rate=2.0,
            input_data=Path("i"), csv_path=Path("o"), request_count=1,
        )  # fmt: skip
    # The CSV of a rate level names its first column "Request Rate".
    path = tmp_path / "r560.csv"
    path.write_text(CSV.replace("Concurrency,", "Request Rate,").replace("\n2,", "\n560,"))
    rate = parse_report(path)
    assert rate["request_rate"] == 560 and "concurrency" not in rate
    assert format_table([rate]).splitlines()[2].startswith("| 560/s Poisson | 1273.4 |")
    one = {"concurrency": 1.0, "p50_ms": 2.5, "p99_ms": 4.0, "throughput": 400.0}
    assert tail_ratio([one, rate]) == {
        "request_rate": 560.0, "p99_ms": pytest.approx(32.637), "p50_ms": 2.5,
        "ratio": pytest.approx(32.637 / 2.5),
    }  # fmt: skip
    assert tail_ratio([rate]) is None  # no one-caller level to compare with


def test_worker_counts_are_compared_with_the_first_at_each_closed_loop_level() -> None:
    def level(concurrency: int, throughput: float, p99: float) -> dict[str, float]:
        return {"concurrency": concurrency, "throughput": throughput, "p99_ms": p99}

    rate = {"request_rate": 600.0, "throughput": 590.0, "p99_ms": 4.0}
    per_count = {
        1: [level(1, 1000, 1.2), level(128, 2500, 84.4), rate],
        2: [level(1, 990, 1.3), level(128, 3300, 78.2), rate],
        4: [level(128, 3000, 90.0)],  # measured at 128 only
    }
    assert workers_comparison(per_count) == [
        "c=1: --workers 2 / --workers 1 = 990 / 1,000 texts/s = 0.99x; p99 1.3 vs 1.2 ms",
        "c=128: --workers 2 / --workers 1 = 3,300 / 2,500 texts/s = 1.32x; p99 78.2 vs 84.4 ms",
        "c=128: --workers 4 / --workers 1 = 3,000 / 2,500 texts/s = 1.20x; p99 90.0 vs 84.4 ms",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "1,2"], "--workers needs --repository"),
        (["--workers", "0,2", "--repository", "models"], "counts must be at least 1"),
        (["--workers", "one", "--repository", "models"], "expected counts like 1,2"),
    ],
)
def test_bad_worker_counts_are_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


# A stand-in perf_analyzer: exits 2 with the real binary's words and ten windows of -v output
# until the stability it is given is at least STABLE_FROM (or its windows hold REQUESTS_FROM
# requests), else writes the CSV. The real binary is driven in tests/system.
FAKE = """#!/usr/bin/env python3
import json, os, sys
argv = sys.argv[1:]
value = lambda flag: argv[argv.index(flag) + 1]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(argv) + "\\n")
if os.environ.get("FAKE_BROKEN"):
    sys.exit("error: failed to get model metadata")
stable = int(value("--stability-percentage")) >= int(os.environ["STABLE_FROM"])
longer = int(value("--measurement-request-count")) >= int(os.environ["REQUESTS_FROM"])
if not (stable or longer):
    for n, t in enumerate([300, 600, 450, 500, 550, 400, 520, 480, 610, 470], 1):
        print(f"  Pass [{n}] throughput: {t}.0 infer/sec. Avg latency: 1000 usec")
    print("Failed to obtain stable measurement within 10 measurement windows for concurrency 4.")
    sys.exit(2)
open(value("-f"), "w").write(os.environ["FAKE_CSV"])
"""


def run_fake_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log: Path
) -> list[dict[str, float]] | int:
    """run_levels at concurrency 2 against FAKE, each of its calls logged to `log`."""
    import argparse

    from textserve.bench.perf_analyzer import run_levels

    binary = tmp_path / "perf_analyzer"
    binary.write_text(FAKE)
    binary.chmod(0o755)
    monkeypatch.setenv("FAKE_LOG", str(log))
    args = argparse.Namespace(
        model="m", batch_size=1, percentile=None, request_count=100, stability=25,
        tools=tmp_path, level_timeout=30.0, output=tmp_path,
    )  # fmt: skip
    return run_levels(binary, args, "127.0.0.1:1", tmp_path / "in.json", [("concurrency", 2)])


@pytest.mark.parametrize(
    ("stable_from", "requests_from", "calls", "unstable"),
    [
        (0, 10**9, 1, False),  # stable at once: one call, nothing marked
        (10**9, 300, 2, True),  # stable with 3x longer windows: marked by the first attempt
        (1001, 10**9, 3, True),  # never stable: figures of the unchecked third attempt
    ],
)
def test_an_unstable_level_is_measured_again_and_marked_not_failed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stable_from: int,
    requests_from: int,
    calls: int,
    unstable: bool,
) -> None:
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_CSV", CSV)
    monkeypatch.setenv("STABLE_FROM", str(stable_from))
    monkeypatch.setenv("REQUESTS_FROM", str(requests_from))
    reports = run_fake_level(tmp_path, monkeypatch, log)
    assert isinstance(reports, list) and len(reports) == 1
    attempts = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(attempts) == calls
    assert all("-v" in argv for argv in attempts)  # the windows' figures are always printed
    (report,) = reports
    assert report["throughput"] == pytest.approx(1273.4)  # the CSV's figures, kept
    out = capsys.readouterr().out
    if not unstable:
        assert "spread_pct" not in report and "UNSTABLE" not in out
        assert "unstable" not in format_table(reports)
        return
    # 300..610 infer/s over ten windows: (610 - 300) / median 490 = 63 %
    assert report["spread_pct"] == pytest.approx(310 / 490 * 100)
    assert report["windows"] == 10
    assert "UNSTABLE c2: throughput varied by 63% over 10 windows" in out
    second = attempts[1]
    assert second[second.index("--measurement-request-count") + 1] == "300"
    if calls == 3:
        third = attempts[2]
        assert int(third[third.index("--stability-percentage") + 1]) > 1000
    assert "| c=2 **unstable** (windows ±32%) | 1273.4 |" in format_table(reports)


def test_a_perf_analyzer_that_fails_otherwise_still_fails_the_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_BROKEN", "1")
    status = run_fake_level(tmp_path, monkeypatch, log)
    assert status == 1  # not retried: a broken server is not noise
    assert len(log.read_text().splitlines()) == 1
    assert "failed to get model metadata" in capsys.readouterr().err
