"""Unit tests of the OIP model description: metadata, Triton config, statistics from metrics."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from textserve.oip import model_config_pb2 as mc
from textserve.service.dataplane.oip_describe import model_config, model_metadata, model_statistics
from textserve.service.metrics import Metrics


@dataclass
class FakeHandle:
    name: str = "sentiment"
    version: int = 3
    labels: tuple[str, ...] = ("negative", "neutral", "positive")


def test_metadata_lists_versions_and_tensors_with_a_batch_dimension() -> None:
    got = model_metadata(FakeHandle(), versions=[3, 1])
    assert (got.name, list(got.versions), got.platform) == (
        "sentiment",
        ["1", "3"],
        "onnxruntime_onnx",
    )
    assert [(t.name, t.datatype, list(t.shape)) for t in got.inputs] == [("TEXT", "BYTES", [-1, 1])]
    assert [(t.name, t.datatype, list(t.shape)) for t in got.outputs] == [
        ("LABEL", "BYTES", [-1, 1]),
        ("SCORE", "FP32", [-1, 1]),
        ("PROBABILITIES", "FP32", [-1, 3]),
    ]


def test_config_is_what_perf_analyzer_reads() -> None:
    config = model_config(
        FakeHandle(), max_batch_size=256, batcher_max_batch_size=32, max_queue_delay=0.002
    ).config
    assert (config.name, config.platform, config.backend) == (
        "sentiment",
        "onnxruntime_onnx",
        "onnxruntime",
    )
    assert config.max_batch_size == 256
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("TEXT", mc.TYPE_STRING, [1])
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("LABEL", mc.TYPE_STRING, [1]),
        ("SCORE", mc.TYPE_FP32, [1]),
        ("PROBABILITIES", mc.TYPE_FP32, [3]),
    ]
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000
    assert list(config.dynamic_batching.preferred_batch_size) == [32]


def test_statistics_come_from_the_shared_metrics_of_that_model_only() -> None:
    metrics = Metrics(CollectorRegistry())
    for model in ("sentiment", "other"):
        metrics.init_model(model)
    metrics.observe_request("ModelInfer", "sentiment", "OK", 0.5)
    metrics.observe_request("Classify", "sentiment", "OK", 0.25)
    metrics.observe_request("ModelInfer", "sentiment", "INVALID_ARGUMENT", 0.001)
    metrics.observe_request("ModelInfer", "other", "OK", 9.0)
    engine = metrics.for_model("sentiment")  # what the model's batcher and worker write
    engine.on_batch(size=5, padded_tokens=50, padding_ratio=0.1, seconds=0.004)
    engine.on_batch(size=3, padded_tokens=30, padding_ratio=0.0, seconds=0.0)
    engine.on_queue_waits([0.002])
    engine.on_tokenize(0.003)

    stats = model_statistics(metrics, "sentiment", "3")
    assert (stats.name, stats.version) == ("sentiment", "3")
    assert (stats.inference_count, stats.execution_count) == (8, 2)
    infer = stats.inference_stats
    assert (infer.success.count, infer.success.ns) == (2, 750_000_000)
    assert (infer.fail.count, infer.fail.ns) == (1, 1_000_000)
    assert (infer.queue.count, infer.queue.ns) == (1, 2_000_000)
    # perf_analyzer requires the three compute counts to be equal: all count batches
    assert (infer.compute_input.count, infer.compute_input.ns) == (2, 3_000_000)
    assert (infer.compute_infer.count, infer.compute_infer.ns) == (2, 4_000_000)
    assert (infer.compute_output.count, infer.compute_output.ns) == (2, 0)


def test_statistics_of_a_model_without_traffic_are_zero() -> None:
    stats = model_statistics(Metrics(CollectorRegistry()), "idle", "1")
    assert stats.inference_stats.success.count == 0
    assert stats.execution_count == 0
    assert stats.inference_stats.queue.ns == pytest.approx(0)
