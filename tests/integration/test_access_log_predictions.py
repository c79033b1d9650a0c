"""Structured access logs (--access-log json) and prediction monitoring, on a real server:
one JSON line per request with the right fields for OK, INVALID_ARGUMENT and
RESOURCE_EXHAUSTED, the texts only with --log-texts, lines over the rate dropped and counted;
textserve_predictions_total matches the labels the server actually returned."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.handmade import make_version
from tests.serving import running_server
from textserve.oip import grpc_service_pb2 as oip
from textserve.oip import grpc_service_pb2_grpc as oip_grpc
from textserve.service.access_log import LOGGER
from textserve.service.config import BatcherConfig
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

MODEL = "handmade"
SECRET = "my secret diagnosis is good"


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


@pytest.fixture
def access_lines() -> Iterator[Lines]:
    """The "textserve.access" logger's lines (a handler set before the server starts is the
    one it writes to)."""
    logger = logging.getLogger(LOGGER)
    handler = Lines()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def code_of(call: Any, request: Any) -> grpc.StatusCode:
    try:
        call(request, timeout=30)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("log_texts", [False, True])
def test_access_log_lines_for_ok_invalid_and_overloaded_requests(
    tmp_path: Path, access_lines: Lines, log_texts: bool
) -> None:
    make_version(tmp_path, MODEL, 1)
    with running_server(
        tmp_path,
        access_log="json",
        log_texts=log_texts,
        batcher=BatcherConfig(max_queue_size=4),
    ) as srv:
        stub = pb_grpc.ClassifierStub(srv.channel())
        ok = code_of(stub.Classify, pb.ClassifyRequest(texts=[SECRET, "bad film"]))
        invalid = code_of(stub.Classify, pb.ClassifyRequest(texts=[SECRET, ""]))
        # 5 texts can never fit a queue of 4: refused at once
        overloaded = code_of(stub.Classify, pb.ClassifyRequest(texts=[SECRET] * 5))
        request = oip.ModelInferRequest(model_name=MODEL)
        tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[1])
        tensor.contents.bytes_contents.append(SECRET.encode())
        oip_ok = code_of(oip_grpc.GRPCInferenceServiceStub(srv.channel()).ModelInfer, request)
    assert (ok, invalid, overloaded, oip_ok) == (
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.OK,
    )
    lines = access_lines.lines
    assert [line["status"] for line in lines] == [
        "OK",
        "INVALID_ARGUMENT",
        "RESOURCE_EXHAUSTED",
        "OK",
    ]
    fields = {
        "time", "peer", "method", "model", "version", "texts", "tokens", "status",
        "queue_ms", "tokenize_ms", "inference_ms", "total_ms", "trace_id",
    }  # fmt: skip
    for line in lines:
        assert fields <= set(line), line
        assert line["peer"].startswith("ipv4:127.0.0.1:"), line
        assert line["model"] == MODEL and line["version"] == 1
        assert line["total_ms"] > 0
        assert line["trace_id"] is None  # tracing is off
        assert line["time"].endswith("+00:00")
        assert ("input" in line) is log_texts
    good, bad, full, oip_line = lines
    assert [line["method"] for line in lines] == ["Classify"] * 3 + ["ModelInfer"]
    assert good["texts"] == 2 and good["tokens"] >= 2
    assert good["queue_ms"] >= 0 and good["inference_ms"] >= 0 and good["tokenize_ms"] >= 0
    assert bad["texts"] == 2 and bad["tokens"] is None and bad["inference_ms"] is None
    assert full["texts"] == 5 and full["tokens"] is None
    assert oip_line["texts"] == 1 and oip_line["tokens"] >= 1
    everything = json.dumps(lines)
    if log_texts:
        assert good["input"] == [SECRET, "bad film"]
        assert full["input"] == [SECRET] * 5
    else:
        assert "secret" not in everything  # never the texts unless asked


def test_access_log_lines_over_the_rate_are_dropped_and_counted(
    tmp_path: Path, access_lines: Lines
) -> None:
    make_version(tmp_path, MODEL, 1)
    # 1 line a second, a burst of 1: of 20 quick requests, a few lines at most get through
    with running_server(tmp_path, access_log="json", access_log_rate=1.0) as srv:
        stub = pb_grpc.ClassifierStub(srv.channel())
        for _ in range(20):
            stub.Classify(pb.ClassifyRequest(texts=["a good film"]), timeout=30)
        dropped = srv.metrics.registry.get_sample_value("textserve_access_log_dropped_total")
    assert dropped is not None
    assert len(access_lines.lines) + dropped == 20
    assert dropped >= 10


def test_prediction_counters_match_the_labels_returned(tmp_path: Path) -> None:
    make_version(tmp_path, MODEL, 1, labels=("negative", "neutral", "positive"))
    texts = ["good", "bad", "a good film", "a bad bad film", "film", "good good good", "dull"]
    with running_server(tmp_path) as srv:
        stub = pb_grpc.ClassifierStub(srv.channel())
        returned: Counter[str] = Counter()
        scores = []
        for i in range(len(texts)):
            response = stub.Classify(pb.ClassifyRequest(texts=texts[: i + 1]), timeout=30)
            returned.update(result.label for result in response.results)
            scores.extend(result.score for result in response.results)
        registry = srv.metrics.registry

        def predicted(label: str) -> float | None:
            return registry.get_sample_value(
                "textserve_predictions_total", {"model": MODEL, "version": "1", "label": label}
            )

        counted = {label: predicted(label) for label in ("negative", "neutral", "positive")}
        confidence_count = registry.get_sample_value(
            "textserve_prediction_confidence_count", {"model": MODEL, "version": "1"}
        )
        confidence_sum = registry.get_sample_value(
            "textserve_prediction_confidence_sum", {"model": MODEL, "version": "1"}
        )
    assert len(set(returned)) >= 2, returned  # the check means something: labels differ
    assert counted == {label: float(returned[label]) for label in counted}
    assert confidence_count == len(scores) == sum(returned.values())
    assert confidence_sum == pytest.approx(sum(scores), rel=1e-5)
