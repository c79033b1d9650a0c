"""Per-request limits are never silent (#40): a request over --max-texts-per-request, or whose
long texts make more windows than it allows, is refused with a message naming the limit, in
each API's own error shape, and counted in textserve_request_limit_refusals_total by limit."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import requests

from tests.handmade import make_version
from tests.serving import RunningServer, running_server
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

LIMIT = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("models")
    make_version(root, "handmade", 1, max_length=8)
    with running_server(root, metrics_port=0, max_texts_per_request=LIMIT) as srv:
        yield srv


def refusals(srv: RunningServer, method: str, limit: str) -> float:
    value = srv.metrics.registry.get_sample_value(
        "textserve_request_limit_refusals_total", {"method": method, "limit": limit}
    )
    return value or 0.0


def post(srv: RunningServer, path: str, body: object) -> requests.Response:
    return requests.post(f"http://127.0.0.1:{srv.server.metrics_port}{path}", json=body, timeout=30)


def test_too_many_texts_are_refused_by_name_and_counted(server: RunningServer) -> None:
    texts = ["a good film"] * (LIMIT + 1)
    before = refusals(server, "Classify", "texts_per_request")
    with server.channel() as channel, pytest.raises(grpc.RpcError) as raised:
        pb_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=texts), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"the limit is {LIMIT}" in raised.value.details()
    assert "--max-texts-per-request" in raised.value.details()
    assert refusals(server, "Classify", "texts_per_request") == before + 1

    before = refusals(server, "HttpClassify", "texts_per_request")
    tei = post(server, "/predict", {"inputs": [[t] for t in texts]})
    vllm = post(server, "/classify", {"input": texts})
    assert tei.status_code == vllm.status_code == 400
    assert "--max-texts-per-request" in tei.json()["error"]
    assert "--max-texts-per-request" in vllm.json()["error"]["message"]
    assert refusals(server, "HttpClassify", "texts_per_request") == before + 2
    assert post(server, "/v1/classify", {"texts": texts[:LIMIT]}).status_code == 200


def test_too_many_windows_are_refused_by_name_and_counted(server: RunningServer) -> None:
    long = " ".join(["a good film and a great plot"] * 10)  # ~60 tokens: ~10 windows of 6
    before = refusals(server, "HttpClassify", "windows_per_request")
    response = post(server, "/v1/classify", {"texts": [long], "windows": True})
    assert response.status_code == 400, response.text
    assert "windows" in response.json()["error"] and str(LIMIT) in response.json()["error"]
    assert refusals(server, "HttpClassify", "windows_per_request") == before + 1
    fits = post(
        server, "/v1/classify", {"texts": ["a good film and a great plot"], "windows": True}
    )
    assert fits.status_code == 200 and fits.json()["results"][0]["windows"] <= LIMIT
