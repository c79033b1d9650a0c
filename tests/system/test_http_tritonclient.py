"""The real tritonclient.http (third-party, unchanged, its defaults) against textserve's KServe
v2 REST routes: liveness, readiness, metadata, config and infer with JSON and with Triton's
binary tensor extension, the same scores as gRPC, errors raised as tritonclient raises them."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.handmade import make_version
from tests.serving import RunningServer, running_server
from textserve.client import Client

MODEL = "handmade"
TEXTS = ["a good film", "the plot is awful", "great and good", "bad bad film", "héllo film"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("models")
    make_version(root, MODEL, 1)
    with running_server(root, metrics_port=0) as running:
        yield running


@pytest.fixture(scope="module")
def triton(srv: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{srv.server.metrics_port}")
    yield client
    client.close()


def grpc_scores(srv: RunningServer) -> list[float]:
    with Client(srv.address) as client:
        return [p.score for p in client.classify(TEXTS).predictions]


def test_health_metadata_and_config(triton: httpclient.InferenceServerClient) -> None:
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready(MODEL) and triton.is_model_ready(MODEL, "1")
    assert not triton.is_model_ready("nope")
    assert triton.get_server_metadata()["name"] == "textserve"
    metadata = triton.get_model_metadata(MODEL)
    assert [t["name"] for t in metadata["outputs"]] == ["LABEL", "SCORE", "PROBABILITIES"]
    config = triton.get_model_config(MODEL)
    assert config["max_batch_size"] > 0 and config["input"][0]["name"] == "TEXT"
    stats = triton.get_inference_statistics(MODEL)
    assert stats["model_stats"][0]["name"] == MODEL


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_scores_as_grpc(
    srv: RunningServer, triton: httpclient.InferenceServerClient, binary: bool
) -> None:
    text = httpclient.InferInput("TEXT", [len(TEXTS), 1], "BYTES")
    text.set_data_from_numpy(
        np.array([[t.encode()] for t in TEXTS], dtype=np.object_), binary_data=binary
    )
    outputs = [
        httpclient.InferRequestedOutput(name, binary_data=binary)
        for name in ("LABEL", "SCORE", "PROBABILITIES")
    ]
    result = triton.infer(MODEL, [text], outputs=outputs, model_version="1")
    scores = result.as_numpy("SCORE")
    assert scores is not None and scores.shape == (len(TEXTS), 1)
    assert scores.ravel().tolist() == pytest.approx(grpc_scores(srv), abs=1e-7)
    probabilities = result.as_numpy("PROBABILITIES")
    assert probabilities is not None and probabilities.shape == (len(TEXTS), 2)
    labels = result.as_numpy("LABEL")
    assert labels is not None
    # binary BYTES come back as bytes, JSON ones as str
    names = {x.decode() if isinstance(x, bytes) else x for x in labels.ravel()}
    assert names <= {"positive", "negative"}


def test_defaults_ask_for_binary_outputs(
    srv: RunningServer, triton: httpclient.InferenceServerClient
) -> None:
    text = httpclient.InferInput("TEXT", [len(TEXTS)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=np.object_))
    result = triton.infer(MODEL, [text])  # no outputs named: binary_data_output
    scores = result.as_numpy("SCORE")
    assert scores is not None
    assert scores.tolist() == pytest.approx(grpc_scores(srv), abs=1e-7)


def test_errors_are_raised_with_the_servers_message(
    triton: httpclient.InferenceServerClient,
) -> None:
    text = httpclient.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([b""], dtype=np.object_))
    with pytest.raises(InferenceServerException, match="empty"):
        triton.infer(MODEL, [text])
    with pytest.raises(InferenceServerException, match="nope"):
        triton.infer("nope", [text])
