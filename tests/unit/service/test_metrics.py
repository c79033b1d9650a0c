"""textserve.service.metrics: values read back from a fresh registry after known traffic."""

from __future__ import annotations

import itertools
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from textserve.service.metrics import (
    CODES,
    FAILURE_REASONS,
    LATENCY_BUCKETS,
    LOAD_FAILURE_REASONS,
    METHODS,
    UNKNOWN_MODEL,
    Metrics,
    reason_for_code,
    start_metrics_server,
)


@pytest.fixture
def metrics() -> Metrics:
    m = Metrics(CollectorRegistry())
    m.init_model("default")
    return m


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_series_exist_at_zero_after_init_model(metrics: Metrics) -> None:
    for method in METHODS:
        assert value(metrics, "textserve_requests_total", method=method, model="default") == 0
        assert (
            value(
                metrics,
                "textserve_request_duration_seconds_count",
                method=method,
                model="default",
                code="OK",
            )
            == 0
        )
        for reason in FAILURE_REASONS:
            labels = {"method": method, "model": "default", "reason": reason}
            assert value(metrics, "textserve_request_failures_total", **labels) == 0
    for stage in ("queue", "tokenize", "inference"):
        assert value(metrics, f"textserve_{stage}_duration_seconds_count", model="default") == 0
    for name in ("textserve_batch_size", "textserve_batch_tokens", "textserve_batch_padding_ratio"):
        assert value(metrics, f"{name}_count", model="default") == 0
    assert value(metrics, "textserve_queue_depth", model="default") == 0
    for reason in LOAD_FAILURE_REASONS:
        labels = {"model": "default", "reason": reason}
        assert value(metrics, "textserve_model_load_failures_total", **labels) == 0


def test_an_uninitialised_model_has_no_series() -> None:
    m = Metrics(CollectorRegistry())
    labels = {"method": "Classify", "model": "default"}
    assert value(m, "textserve_requests_total", **labels) is None


def test_requests_latency_and_failures_by_reason(metrics: Metrics) -> None:
    for seconds in (0.0002, 0.003, 0.003, 0.04):
        metrics.observe_request("Classify", "default", "OK", seconds)
    metrics.observe_request("Classify", "default", "INVALID_ARGUMENT", 0.0001)
    metrics.observe_request("ModelInfer", "default", "RESOURCE_EXHAUSTED", 0.0001)
    metrics.observe_request("ModelInfer", "default", "RESOURCE_EXHAUSTED", 0.0001)
    metrics.observe_request("ClassifyStream", "default", "DATA_LOSS", 0.5)

    assert value(metrics, "textserve_requests_total", method="Classify", model="default") == 5
    assert value(metrics, "textserve_requests_total", method="ModelInfer", model="default") == 2
    ok = {"method": "Classify", "model": "default", "code": "OK"}
    assert value(metrics, "textserve_request_duration_seconds_count", **ok) == 4
    assert value(metrics, "textserve_request_duration_seconds_sum", **ok) == pytest.approx(0.0462)
    # Cumulative buckets: 2 ms holds one observation, 3 ms three, 50 ms all four.
    assert value(metrics, "textserve_request_duration_seconds_bucket", le="0.002", **ok) == 1
    assert value(metrics, "textserve_request_duration_seconds_bucket", le="0.003", **ok) == 3
    assert value(metrics, "textserve_request_duration_seconds_bucket", le="0.05", **ok) == 4
    bad = {"method": "Classify", "model": "default", "code": "INVALID_ARGUMENT"}
    assert value(metrics, "textserve_request_duration_seconds_count", **bad) == 1

    def failures(method: str, reason: str) -> float | None:
        labels = {"method": method, "model": "default", "reason": reason}
        return value(metrics, "textserve_request_failures_total", **labels)

    assert failures("Classify", "invalid_argument") == 1
    assert failures("ModelInfer", "resource_exhausted") == 2
    assert failures("ClassifyStream", "internal") == 1
    assert failures("Classify", "resource_exhausted") == 0


def test_a_request_for_an_unknown_model_never_creates_a_label_from_user_text(
    metrics: Metrics,
) -> None:
    metrics.observe_request("Classify", "no-such-model; DROP TABLE", "NOT_FOUND", 0.001)
    labels = {"method": "Classify", "model": UNKNOWN_MODEL, "reason": "not_found"}
    assert value(metrics, "textserve_request_failures_total", **labels) == 1
    exposition = metrics.registry.collect()
    assert not any(
        "DROP" in sample.labels.get("model", "")
        for family in exposition
        for sample in family.samples
    )


def test_stage_histograms_count_per_stage(metrics: Metrics) -> None:
    model = metrics.for_model("default")
    model.on_queue_waits([0.001, 0.002])
    model.on_tokenize(0.0003)
    model.on_batch(size=1, padded_tokens=4, padding_ratio=0.0, seconds=0.01)
    assert value(metrics, "textserve_queue_duration_seconds_count", model="default") == 2
    assert value(metrics, "textserve_tokenize_duration_seconds_count", model="default") == 1
    assert value(metrics, "textserve_inference_duration_seconds_count", model="default") == 1
    assert value(metrics, "textserve_inference_duration_seconds_sum", model="default") == 0.01


def test_batches_sizes_tokens_and_padding(metrics: Metrics) -> None:
    model = metrics.for_model("default")
    model.on_batch(size=3, padded_tokens=3 * 20, padding_ratio=0.25, seconds=0.001)
    model.on_batch(size=8, padded_tokens=8 * 64, padding_ratio=0.0, seconds=0.001)
    model.on_batch(size=1, padded_tokens=7, padding_ratio=0.0, seconds=0.001)
    # a ratio outside [0, 1] (float rounding) is clamped, never an error on the hot path
    model.on_batch(size=1, padded_tokens=7, padding_ratio=-1e-9, seconds=0.001)
    assert value(metrics, "textserve_batch_size_count", model="default") == 4
    assert value(metrics, "textserve_batch_size_sum", model="default") == 13
    # Power-of-two buckets: 1 → le=1, 3 → le=4, 8 → le=8.
    assert value(metrics, "textserve_batch_size_bucket", model="default", le="1.0") == 2
    assert value(metrics, "textserve_batch_size_bucket", model="default", le="2.0") == 2
    assert value(metrics, "textserve_batch_size_bucket", model="default", le="4.0") == 3
    assert value(metrics, "textserve_batch_size_bucket", model="default", le="8.0") == 4
    assert value(metrics, "textserve_batch_tokens_sum", model="default") == 60 + 512 + 7 + 7
    assert value(metrics, "textserve_batch_padding_ratio_bucket", model="default", le="0.0") == 3
    assert value(metrics, "textserve_batch_padding_ratio_sum", model="default") == 0.25


def test_queue_depth_and_load_failures(metrics: Metrics) -> None:
    metrics.for_model("default").on_queue_depth(17)
    assert value(metrics, "textserve_queue_depth", model="default") == 17
    metrics.count_load_failure("default", "checksum_mismatch")
    labels = {"model": "default", "reason": "checksum_mismatch"}
    assert value(metrics, "textserve_model_load_failures_total", **labels) == 1


def test_model_info_keeps_only_the_served_version(metrics: Metrics) -> None:
    metrics.set_model_info("default", 1, "CPUExecutionProvider")
    metrics.set_model_info("default", 2, "CPUExecutionProvider")
    old = {
        "model": "default",
        "version": "1",
        "provider": "CPUExecutionProvider",
        "precision": "fp32",
    }
    new = {
        "model": "default",
        "version": "2",
        "provider": "CPUExecutionProvider",
        "precision": "fp32",
    }
    assert value(metrics, "textserve_model_info", **old) is None
    assert value(metrics, "textserve_model_info", **new) == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.observe_request("Predict", "default", "OK", 0.1), "unknown method"),
        (lambda m: m.observe_request("Classify", "default", "BAD", 0.1), "status code"),
        (lambda m: m.count_load_failure("default", "oops"), "load failure reason"),
        (lambda m: m.init_model(""), "must not be empty"),
    ],
)
def test_bad_labels_and_values_are_refused(metrics: Metrics, call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(metrics)


def test_every_failing_code_maps_to_a_known_reason() -> None:
    for code in CODES:
        if code != "OK":
            assert reason_for_code(code) in FAILURE_REASONS
    assert reason_for_code("RESOURCE_EXHAUSTED") == "resource_exhausted"
    with pytest.raises(ValueError, match="not a failure"):
        reason_for_code("OK")


def test_latency_buckets_are_fine_from_100us_to_10s() -> None:
    assert LATENCY_BUCKETS[0] == 0.0001
    assert LATENCY_BUCKETS[-1] == 10.0
    ratios = [b / a for a, b in itertools.pairwise(LATENCY_BUCKETS)]
    assert max(ratios) <= 1.5 + 1e-9
    assert all(r > 1 for r in ratios)
    assert len(LATENCY_BUCKETS) == 46  # the README's figure


def test_every_latency_histogram_exposes_the_46_buckets(metrics: Metrics) -> None:
    """What a scrape sees: 46 bounds and +Inf on each latency histogram, the same bounds."""
    metrics.observe_request("Classify", "default", "OK", 0.01)
    latency = {
        "textserve_request_duration_seconds", "textserve_queue_duration_seconds",
        "textserve_tokenize_duration_seconds", "textserve_inference_duration_seconds",
    }  # fmt: skip
    bounds: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name.removesuffix("_bucket") in latency and sample.name.endswith("_bucket"):
                bounds.setdefault(sample.name, set()).add(sample.labels["le"])
    assert set(bounds) == {f"{name}_bucket" for name in latency}
    expected = {str(float(b)) for b in LATENCY_BUCKETS} | {"+Inf"}
    assert len(expected) == 47
    assert all(found == expected for found in bounds.values()), bounds


def test_default_registry_exposes_process_metrics() -> None:
    m = Metrics()
    cpu = m.registry.get_sample_value("process_cpu_seconds_total")
    assert cpu is not None and cpu > 0
    # A second instance in the same process does not clash with the first (constructing it
    # does not raise), has the process metrics too, and counts on its own.
    other = Metrics()
    assert other.registry.get_sample_value("process_cpu_seconds_total") is not None
    m.init_model("default")
    other.init_model("default")
    m.observe_request("Classify", "default", "OK", 0.01)
    labels = {"method": "Classify", "model": "default"}
    assert m.registry.get_sample_value("textserve_requests_total", labels) == 1
    assert other.registry.get_sample_value("textserve_requests_total", labels) == 0


def test_metrics_server_serves_the_registry_on_a_bound_port(metrics: Metrics) -> None:
    metrics.observe_request("Classify", "default", "OK", 0.01)
    server, port = start_metrics_server(0, "127.0.0.1", metrics.registry)
    with server:
        assert port > 0 and server.port == port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
    assert 'textserve_requests_total{method="Classify",model="default"} 1.0' in body
    server.close()  # idempotent
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_metrics_server_reports_a_busy_port(metrics: Metrics) -> None:
    first, port = start_metrics_server(0, "127.0.0.1", metrics.registry)
    with first, pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
        start_metrics_server(port, "127.0.0.1", metrics.registry)
