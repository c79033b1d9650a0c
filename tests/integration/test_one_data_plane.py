"""gRPC and HTTP are two codecs over ONE data plane: a textserve.v1 Classify and an HTTP
/v1/classify reach the same data-plane prologue with the same call; a KServe v2 ModelInfer over
gRPC and a POST .../infer over HTTP the same dataplane.oip.infer; ModelConfig and GET .../config
the same dataplane.oip.model_config_of. A spy on the data plane's own functions (the server runs
in this process) sees every one of them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import requests

from tests.handmade import make_version
from tests.serving import RunningServer, running_server
from textserve.oip import grpc_service_pb2 as oip_pb
from textserve.oip import grpc_service_pb2_grpc as oip_grpc
from textserve.service.dataplane import classify as dataplane_classify
from textserve.service.dataplane import oip as dataplane_oip
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

MODEL = "handmade"
TEXTS = ["a good film", "a bad plot"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("models")
    make_version(root, MODEL, 1)
    with running_server(root, metrics_port=0) as running:
        yield running


def _http(srv: RunningServer, path: str) -> str:
    return f"http://127.0.0.1:{srv.server.metrics_port}{path}"


def _spy(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[tuple[Any, ...]]:
    """Record every call of `module.name` (its arguments), then call it."""
    calls: list[tuple[Any, ...]] = []
    real = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


def test_grpc_and_http_classify_reach_the_same_prologue_with_the_same_call(
    srv: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _spy(monkeypatch, dataplane_classify, "prologue")
    with srv.channel() as channel:
        grpc_answer = pb_grpc.ClassifierStub(channel).Classify(
            pb.ClassifyRequest(texts=TEXTS, model=MODEL, top_k=2), timeout=30
        )
    http_answer = requests.post(
        _http(srv, "/v1/classify"), json={"texts": TEXTS, "model": MODEL, "top_k": 2}, timeout=30
    )
    assert http_answer.status_code == 200, http_answer.text
    assert len(calls) == 2
    (_, grpc_call, _), (_, http_call, _) = calls
    assert isinstance(grpc_call, dataplane_classify.ClassifyCall)
    assert (list(grpc_call.texts), grpc_call.model, grpc_call.top_k) == (TEXTS, MODEL, 2)
    assert (list(http_call.texts), http_call.model, http_call.top_k) == (TEXTS, MODEL, 2)
    # and the same answer: labels and scores (float32 on both wires)
    body = http_answer.json()
    assert [r["label"] for r in body["results"]] == [r.label for r in grpc_answer.results]
    assert [r["score"] for r in body["results"]] == pytest.approx(
        [r.score for r in grpc_answer.results], abs=1e-6
    )


def test_grpc_and_http_kserve_infer_and_config_reach_the_same_operations(
    srv: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolved = _spy(monkeypatch, dataplane_oip, "resolve")
    configs = _spy(monkeypatch, dataplane_oip, "model_config")
    request = oip_pb.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[len(TEXTS)])
    tensor.contents.bytes_contents.extend(t.encode() for t in TEXTS)
    with srv.channel() as channel:
        stub = oip_grpc.GRPCInferenceServiceStub(channel)
        stub.ModelInfer(request, timeout=30)
        stub.ModelConfig(oip_pb.ModelConfigRequest(name=MODEL), timeout=30)
    infer = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": TEXTS}]}
    answer = requests.post(_http(srv, f"/v2/models/{MODEL}/infer"), json=infer, timeout=30)
    assert answer.status_code == 200, answer.text
    assert requests.get(_http(srv, f"/v2/models/{MODEL}/config"), timeout=30).status_code == 200
    # infer and config each resolve the model once, on both transports
    assert [args[1:] for args in resolved] == [(MODEL, "")] * 4
    assert len(configs) == 2


def test_an_unknown_model_is_the_same_error_on_both_codecs(srv: RunningServer) -> None:
    with srv.channel() as channel, pytest.raises(grpc.RpcError) as caught:
        pb_grpc.ClassifierStub(channel).Classify(
            pb.ClassifyRequest(texts=TEXTS, model="nope"), timeout=30
        )
    answer = requests.post(
        _http(srv, "/v1/classify"), json={"texts": TEXTS, "model": "nope"}, timeout=30
    )
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    assert answer.status_code == 404
    assert answer.json()["code"] == "NOT_FOUND"
    assert answer.json()["error"] == caught.value.details()
