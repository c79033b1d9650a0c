"""The observability pieces with fakes (issue 17): exemplars in the OpenMetrics exposition,
prediction series, the access log's token bucket, the flags, and that tracing off imports no
opentelemetry (the engine's batch-trace hook: tests/unit/service/engine/test_batch_trace.py;
the client's traceparent: tests/unit/textserve/test_client.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import urllib.request
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from textserve.cli import CliError, build_parser
from textserve.service import cli as serve_cli
from textserve.service.access_log import AccessLog, TokenBucket
from textserve.service.metrics import Metrics, start_metrics_server

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def scrape(port: int, accept: str | None) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if accept:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.read().decode())


def test_sampled_requests_are_exemplars_of_the_latency_histogram_in_openmetrics() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.init_model("m")
    metrics.observe_request("Classify", "m", "OK", 0.0042, {"trace_id": TRACE_ID})
    metrics.observe_request("Classify", "m", "OK", 0.0042)  # not sampled: no exemplar
    server, port = start_metrics_server(0, "127.0.0.1", metrics.registry)
    with server:
        openmetrics = scrape(port, OPENMETRICS)
        plain = scrape(port, None)
    bucket = next(
        line
        for line in openmetrics.splitlines()
        if line.startswith("textserve_request_duration_seconds_bucket{")
        and 'method="Classify",' in line
        and "# {" in line
    )
    assert f'# {{trace_id="{TRACE_ID}"}} 0.0042' in bucket
    assert 'le="0.005"' in bucket  # on the bucket the request fell in
    assert "trace_id" not in plain  # the Prometheus text format has no exemplars


def test_prediction_series_exist_at_zero_and_count_winning_labels() -> None:
    metrics = Metrics(CollectorRegistry())
    predictions = metrics.for_predictions("m", 2, ["neg", "pos"])
    registry = metrics.registry

    def count(label: str) -> float | None:
        return registry.get_sample_value(
            "textserve_predictions_total", {"model": "m", "version": "2", "label": label}
        )

    assert (count("neg"), count("pos")) == (0.0, 0.0)
    probabilities = np.array([[0.1, 0.9], [0.4, 0.6], [0.99, 0.01]], np.float32)
    predictions.observe(probabilities)  # winners pos, pos, neg; confidences 0.9, 0.6, 0.99
    assert (count("neg"), count("pos")) == (1.0, 2.0)
    labels = {"model": "m", "version": "2"}
    assert registry.get_sample_value("textserve_prediction_confidence_count", labels) == 3
    bucket = registry.get_sample_value(
        "textserve_prediction_confidence_bucket", {**labels, "le": "0.9"}
    )
    assert bucket == 2  # 0.6 and 0.9


def test_the_token_bucket_refills_at_its_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(2.0, clock=lambda: now[0])
    assert [bucket.take() for _ in range(3)] == [True, True, False]  # a burst of 2
    now[0] = 0.5  # one token back
    assert [bucket.take(), bucket.take()] == [True, False]
    now[0] = 100.0  # never more than the burst
    assert [bucket.take() for _ in range(3)] == [True, True, False]


def test_access_log_drops_and_counts_lines_over_the_rate() -> None:
    now = [0.0]
    lines: list[str] = []
    metrics = Metrics(CollectorRegistry())
    log = AccessLog(rate=1.0, metrics=metrics, emit=lines.append, clock=lambda: now[0])
    fields: dict[str, Any] = dict(
        method="Classify", peer="ipv4:127.0.0.1:1", model="m", version=1, texts=["t"],
        tokens=1, status="OK", timings=None, seconds=0.001, trace_id=None,
    )  # fmt: skip
    for _ in range(3):
        log.write(**fields)
    assert len(lines) == 1 and log.dropped == 2
    assert metrics.registry.get_sample_value("textserve_access_log_dropped_total") == 2
    assert '"input"' not in lines[0] and '"t"' not in lines[0]


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_observability_is_off_by_default_and_flags_turn_it_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = serve_cli.build_config(parse(["serve"]))
    assert (config.otlp_endpoint, config.access_log, config.log_texts) == (None, "off", False)
    assert config.trace_sample_ratio == 0.1
    monkeypatch.setenv("TEXTSERVE_OTLP_ENDPOINT", "http://collector:4317")
    config = serve_cli.build_config(
        parse(["serve", "--trace-sample-ratio", "0.5", "--access-log", "json", "--log-texts"])
    )
    assert config.otlp_endpoint == "http://collector:4317"
    assert (config.trace_sample_ratio, config.access_log, config.log_texts) == (0.5, "json", True)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--trace-sample-ratio", "1.5"], "--trace-sample-ratio"),
        (["--access-log-rate", "0"], "--access-log-rate"),
        (["--otlp-endpoint", " "], "--otlp-endpoint"),
    ],
)
def test_bad_observability_flags_name_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(CliError, match=flag):
        serve_cli.build_config(parse(["serve", *argv]))


def test_tracing_off_never_imports_opentelemetry() -> None:
    code = (
        "import sys\n"
        "from prometheus_client import CollectorRegistry\n"
        "from textserve.service.server import telemetry\n"
        "from textserve.service.config import ServerConfig\n"
        "from textserve.service.metrics import Metrics\n"
        "import textserve.client\n"
        "t = telemetry(ServerConfig(access_log='json'), Metrics(CollectorRegistry()))\n"
        "assert t.tracing is None and t.access_log is not None\n"
        "textserve.client._traced(())\n"
        "loaded = [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
