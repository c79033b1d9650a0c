"""The OIP servicer on a real server: same port, repository, batcher and metrics as textserve.v1.

Uses textserve's own generated `inference` stubs (tritonclient, whose protobuf package clashes
with them in one process, is exercised in tests/system/test_oip_tritonclient.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.serving import RunningServer, running_server
from textserve.oip import grpc_service_pb2 as pb
from textserve.oip import grpc_service_pb2_grpc as pb_grpc
from textserve.service.dataplane.oip_codec import pack_bytes, unpack_bytes
from textserve.v1 import classifier_pb2 as v1
from textserve.v1 import classifier_pb2_grpc as v1_grpc

TEXTS = ["a good film", "the plot is awful", "great and good", "bad bad film"]


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> Iterator[RunningServer]:
    with running_server(tiny_repository) as running:
        yield running


@pytest.fixture(scope="module")
def stubs(server: RunningServer) -> Iterator[tuple[pb_grpc.GRPCInferenceServiceStub, Any]]:
    with server.channel() as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel), v1_grpc.ClassifierStub(channel)


def model_name(server: RunningServer) -> str:
    return server.server.repository.get().name


def infer_request(model: str, texts: list[str], *, raw: bool) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id="r1")
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[len(texts)])
    encoded = [t.encode() for t in texts]
    if raw:
        request.raw_input_contents.append(pack_bytes(encoded))
    else:
        tensor.contents.bytes_contents.extend(encoded)
    return request


def probabilities(response: pb.ModelInferResponse) -> np.ndarray:
    index = [o.name for o in response.outputs].index("PROBABILITIES")
    output = response.outputs[index]
    if response.raw_output_contents:
        flat = np.frombuffer(response.raw_output_contents[index], "<f4")
    else:
        flat = np.asarray(output.contents.fp32_contents, dtype=np.float32)
    return flat.reshape(list(output.shape))


def test_oip_is_served_and_healthy_on_the_same_port(server: RunningServer) -> None:
    assert "inference.GRPCInferenceService" in server.server.service_names
    with server.channel() as channel:
        status = (
            health_pb2_grpc.HealthStub(channel)
            .Check(health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService"))
            .status
        )
    assert status == health_pb2.HealthCheckResponse.SERVING


def test_raw_and_typed_encodings_agree_with_classify(server: RunningServer, stubs) -> None:
    oip, classifier = stubs
    model = model_name(server)
    raw = oip.ModelInfer(infer_request(model, TEXTS, raw=True), timeout=30)
    typed = oip.ModelInfer(infer_request(model, TEXTS, raw=False), timeout=30)
    reference = classifier.Classify(
        v1.ClassifyRequest(texts=TEXTS, model=model, all_scores=True), timeout=30
    )
    assert typed.raw_output_contents == [] and raw.raw_output_contents
    expected = np.array([r.scores for r in reference.results], dtype=np.float32)
    np.testing.assert_allclose(probabilities(raw), expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(probabilities(typed), expected, rtol=0, atol=1e-6)
    labels = unpack_bytes(raw.raw_output_contents[0], len(TEXTS), "LABEL")
    assert [b.decode() for b in labels] == [r.label for r in reference.results]
    assert list(typed.outputs[0].contents.bytes_contents) == labels
    assert raw.model_version == str(reference.model_version) and raw.id == "r1"


def test_model_infer_is_counted_under_its_own_method(server: RunningServer, stubs) -> None:
    oip, _ = stubs
    model = model_name(server)
    registry = server.metrics.registry

    def count(code: str) -> float:
        labels = {"method": "ModelInfer", "model": model, "code": code}
        return registry.get_sample_value("textserve_request_duration_seconds_count", labels) or 0

    ok, bad = count("OK"), count("INVALID_ARGUMENT")
    oip.ModelInfer(infer_request(model, ["good"], raw=True), timeout=30)
    wrong = infer_request(model, ["good"], raw=True)
    wrong.inputs[0].datatype = "INT64"
    with pytest.raises(grpc.RpcError) as info:
        oip.ModelInfer(wrong, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (count("OK"), count("INVALID_ARGUMENT")) == (ok + 1, bad + 1)


def test_core_validation_errors_name_the_tensor(server: RunningServer, stubs) -> None:
    oip, _ = stubs
    with pytest.raises(grpc.RpcError) as info:
        oip.ModelInfer(infer_request(model_name(server), ["good", "   "], raw=True), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("input tensor 'TEXT': texts[1] is empty")


def test_both_apis_share_one_batch(server: RunningServer, stubs) -> None:
    """A Classify and a ModelInfer queued together run as one batch of the shared batcher."""
    oip, classifier = stubs
    handle = server.server.repository.get()
    model = handle.name
    batches = server.metrics.registry.get_sample_value(
        "textserve_batch_size_count", {"model": model}
    )
    assert batches is not None
    server.call(handle.batcher.pause)
    results: dict[str, object] = {}
    calls = [
        threading.Thread(
            target=lambda: results.update(
                classify=classifier.Classify(v1.ClassifyRequest(texts=["good"]), timeout=30)
            )
        ),
        threading.Thread(
            target=lambda: results.update(
                infer=oip.ModelInfer(infer_request(model, ["bad film"], raw=True), timeout=30)
            )
        ),
    ]
    try:
        for thread in calls:
            thread.start()
        deadline = time.monotonic() + 30
        while handle.stats().queue_depth < 2:  # both requests' texts are queued
            assert time.monotonic() < deadline, "the two requests never reached the queue"
            time.sleep(0.01)
    finally:
        server.call(handle.batcher.resume)
    for thread in calls:
        thread.join(timeout=30)
    assert set(results) == {"classify", "infer"}
    after = server.metrics.registry.get_sample_value("textserve_batch_size_count", {"model": model})
    assert after == batches + 1


def test_model_statistics_count_both_apis(server: RunningServer, stubs) -> None:
    oip, classifier = stubs
    model = model_name(server)

    def success() -> int:
        stats = oip.ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=30)
        (only,) = stats.model_stats
        return only.inference_stats.success.count

    def stats() -> Any:
        (only,) = oip.ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=30).model_stats
        return only

    before = stats()
    classifier.Classify(v1.ClassifyRequest(texts=["good"], model=model), timeout=30)
    oip.ModelInfer(infer_request(model, ["good"], raw=False), timeout=30)
    assert success() == before.inference_stats.success.count + 2
    # failures of both APIs, counted apart from the successes
    with pytest.raises(grpc.RpcError) as info:
        classifier.Classify(v1.ClassifyRequest(texts=[], model=model), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = infer_request(model, ["good"], raw=False)
    bad.inputs[0].datatype = "FP32"
    with pytest.raises(grpc.RpcError) as info:
        oip.ModelInfer(bad, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = stats()
    assert after.inference_stats.fail.count == before.inference_stats.fail.count + 2
    assert after.inference_stats.fail.ns > before.inference_stats.fail.ns
    assert after.inference_stats.success.count == before.inference_stats.success.count + 2
    assert after.inference_count == before.inference_count + 2  # texts run, not refused ones
    everything = oip.ModelStatistics(pb.ModelStatisticsRequest(), timeout=30)
    assert [s.name for s in everything.model_stats] == [model]
