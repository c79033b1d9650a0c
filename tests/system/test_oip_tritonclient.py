"""The real tritonclient (third-party, unchanged) against textserve's Open Inference Protocol.

tritonclient runs in a worker process (tritonclient_worker.py): its protobuf package and
textserve's `inference` package cannot be loaded in one process. The server runs here, so the
answers can be compared with textserve.v1's Classify through textserve's own stubs.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.serving import RunningServer, running_server
from textserve.service.dataplane.oip_codec import pack_bytes
from textserve.v1 import classifier_pb2 as v1
from textserve.v1 import classifier_pb2_grpc as v1_grpc

WORKER = Path(__file__).with_name("tritonclient_worker.py")
TEXTS = ["a good film", "the plot is awful", "great and good", "bad bad film", "héllo film"]


class TritonWorker:
    """One tritonclient process; each call sends one JSON op and returns its JSON reply."""

    def __init__(self, url: str) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        assert self._read() == {"ready": True}

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self._stderr.seek(0)
            raise RuntimeError(f"tritonclient worker died:\n{self._stderr.read()}")
        return dict(json.loads(line))

    def __call__(self, **op: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(op) + "\n")
        self.process.stdin.flush()
        return self._read()

    def ok(self, **op: Any) -> Any:
        reply = self(**op)
        assert "error" not in reply, reply
        return reply["result"]

    def error(self, **op: Any) -> dict[str, str]:
        reply = self(**op)
        assert "error" in reply, reply
        return dict(reply["error"])

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._stderr.close()


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> Iterator[RunningServer]:
    with running_server(tiny_repository) as running:
        yield running


@pytest.fixture(scope="module")
def triton(server: RunningServer) -> Iterator[TritonWorker]:
    worker = TritonWorker(server.address)
    yield worker
    worker.close()


@pytest.fixture(scope="module")
def model(server: RunningServer) -> str:
    return str(server.server.repository.get().name)


def text_input(texts: list[str], shape: list[int] | None = None) -> dict[str, Any]:
    return {"name": "TEXT", "datatype": "BYTES", "shape": shape or [len(texts)], "texts": texts}


def classify(server: RunningServer, model: str, texts: list[str]) -> v1.ClassifyResponse:
    with server.channel() as channel:
        request = v1.ClassifyRequest(texts=texts, model=model, all_scores=True)
        return v1_grpc.ClassifierStub(channel).Classify(request, timeout=30)


# -- health and metadata ---------------------------------------------------------------------


def test_server_live_and_ready(triton: TritonWorker) -> None:
    assert triton.ok(op="call", method="is_server_live") is True
    assert triton.ok(op="call", method="is_server_ready") is True


def test_model_ready(triton: TritonWorker, model: str) -> None:
    assert triton.ok(op="call", method="is_model_ready", kwargs={"model_name": model}) is True
    missing = {"model_name": "no-such-model"}
    assert triton.ok(op="call", method="is_model_ready", kwargs=missing) is False
    no_version = {"model_name": model, "model_version": "99"}
    assert triton.ok(op="call", method="is_model_ready", kwargs=no_version) is False


def test_server_metadata(triton: TritonWorker) -> None:
    got = triton.ok(op="call", method="get_server_metadata", kwargs={"as_json": True})
    assert got["name"] == "textserve"
    assert {"model_configuration", "statistics"} <= set(got["extensions"])


def test_model_metadata(triton: TritonWorker, server: RunningServer, model: str) -> None:
    handle = server.server.repository.get()
    got = triton.ok(
        op="call", method="get_model_metadata", kwargs={"model_name": model, "as_json": True}
    )
    assert (got["name"], got["versions"], got["platform"]) == (
        model,
        [str(handle.version)],
        "onnxruntime_onnx",
    )
    # as_json renders int64 as strings (protobuf's JSON mapping)
    assert got["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": ["-1", "1"]}]
    assert [(o["name"], o["datatype"], o["shape"]) for o in got["outputs"]] == [
        ("LABEL", "BYTES", ["-1", "1"]),
        ("SCORE", "FP32", ["-1", "1"]),
        ("PROBABILITIES", "FP32", ["-1", str(len(handle.labels))]),
    ]


def test_model_config(triton: TritonWorker, server: RunningServer, model: str) -> None:
    got = triton.ok(
        op="call", method="get_model_config", kwargs={"model_name": model, "as_json": True}
    )["config"]
    config = server.server.config
    assert (got["name"], got["platform"], got["backend"]) == (
        model,
        "onnxruntime_onnx",
        "onnxruntime",
    )
    assert got["max_batch_size"] == config.max_texts_per_request
    assert got["input"] == [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": ["1"]}]
    assert [o["name"] for o in got["output"]] == ["LABEL", "SCORE", "PROBABILITIES"]
    # proto3 JSON leaves out fields at their default (0: no waiting, the server's default).
    delay = int(got["dynamic_batching"].get("max_queue_delay_microseconds", 0))
    assert delay == round(config.batcher.max_queue_delay * 1e6)


def test_model_statistics_count_inferences(triton: TritonWorker, model: str) -> None:
    def stats() -> dict[str, Any]:
        got = triton.ok(
            op="call",
            method="get_inference_statistics",
            kwargs={"model_name": model, "as_json": True},
        )
        (only,) = got["model_stats"]
        return dict(only)

    before = stats()
    triton.ok(op="infer", model=model, inputs=[text_input(TEXTS[:3])])
    after = stats()
    success = after["inference_stats"]["success"]
    assert int(success["count"]) == int(before["inference_stats"]["success"].get("count", 0)) + 1
    assert int(success["ns"]) > 0
    assert int(after["inference_count"]) >= int(before.get("inference_count", 0)) + 3
    assert int(after["inference_stats"]["compute_infer"]["count"]) >= 1


# -- inference -------------------------------------------------------------------------------


def test_infer_raw_matches_classify(
    triton: TritonWorker, server: RunningServer, model: str
) -> None:
    got = triton.ok(op="infer", model=model, inputs=[text_input(TEXTS)], request_id="req-42")
    reference = classify(server, model, TEXTS)
    assert got["raw"] is True  # tritonclient sent raw_input_contents: answered raw
    assert (got["id"], got["model_name"]) == ("req-42", model)
    assert got["model_version"] == str(reference.model_version)
    outputs = got["outputs"]
    assert list(outputs) == ["LABEL", "SCORE", "PROBABILITIES"]
    assert outputs["LABEL"]["data"] == [r.label for r in reference.results]
    assert outputs["LABEL"]["shape"] == [len(TEXTS)]
    np.testing.assert_allclose(outputs["SCORE"]["data"], [r.score for r in reference.results])
    probs = np.array(outputs["PROBABILITIES"]["data"]).reshape(outputs["PROBABILITIES"]["shape"])
    expected = np.array([r.scores for r in reference.results])
    assert probs.shape == (len(TEXTS), len(reference.labels))
    np.testing.assert_allclose(probs, expected, rtol=0, atol=1e-6)


def test_infer_batched_column_with_a_subset_of_outputs(
    triton: TritonWorker, server: RunningServer, model: str
) -> None:
    texts = TEXTS[:4]
    got = triton.ok(
        op="infer",
        model=model,
        inputs=[text_input(texts, shape=[4, 1])],
        outputs=["SCORE", "LABEL"],
        parameters={"truncate": True},
    )
    outputs = got["outputs"]
    assert list(outputs) == ["SCORE", "LABEL"]
    assert outputs["LABEL"]["shape"] == [4, 1] and outputs["SCORE"]["shape"] == [4, 1]
    assert outputs["LABEL"]["data"] == [r.label for r in classify(server, model, texts).results]


def test_infer_typed_contents_answers_typed(
    triton: TritonWorker, server: RunningServer, model: str
) -> None:
    """Typed contents (what KServe/MLServer JSON-minded clients send), through tritonclient's
    own generated stub and messages."""
    texts = TEXTS[:2]
    request = {
        "model_name": model,
        "id": "typed",
        "inputs": [
            {
                "name": "TEXT",
                "datatype": "BYTES",
                "shape": [2],
                "contents": {
                    "bytes_contents": [base64.b64encode(t.encode()).decode() for t in texts]
                },
            }
        ],
        "outputs": [{"name": "PROBABILITIES"}, {"name": "LABEL"}],
    }
    got = triton.ok(op="stub", method="ModelInfer", request=request)
    assert "raw_output_contents" not in got and got["id"] == "typed"
    probs, label = got["outputs"]
    reference = classify(server, model, texts)
    np.testing.assert_allclose(
        np.array(probs["contents"]["fp32_contents"]).reshape(2, -1),
        [r.scores for r in reference.results],
        rtol=0,
        atol=1e-6,
    )
    decoded = [base64.b64decode(b).decode() for b in label["contents"]["bytes_contents"]]
    assert decoded == [r.label for r in reference.results]


# -- errors ----------------------------------------------------------------------------------

INVALID = "StatusCode.INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        (
            [{"name": "TEXT", "datatype": "FP32", "shape": [2], "floats": [1.0, 2.0]}],
            [],
            "input tensor 'TEXT': datatype must be BYTES, got FP32",
        ),
        (
            [{**text_input(["a", "b"]), "shape": [3]}],
            [],
            "holds 2 element(s) but the shape needs 3",
        ),
        ([], [], "input tensor 'TEXT' is missing"),
        (
            [{**text_input(["a"]), "name": "INPUT0"}],
            [],
            "unexpected input tensor 'INPUT0'",
        ),
        ([text_input(["a"])], ["LOGITS"], "unknown output tensor 'LOGITS'"),
        (
            [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "bytes_b64": ["//4="]}],
            [],
            "input tensor 'TEXT': element 0 is not valid UTF-8",
        ),
    ],
    ids=["datatype", "shape", "missing", "unexpected", "unknown-output", "utf8"],
)
def test_bad_tensors_are_invalid_argument(
    triton: TritonWorker, model: str, inputs: list[Any], outputs: list[str], message: str
) -> None:
    error = triton.error(op="infer", model=model, inputs=inputs, outputs=outputs)
    assert error["status"] == INVALID
    assert message in error["message"]


def test_malformed_raw_framing_is_invalid_argument(triton: TritonWorker, model: str) -> None:
    raw = pack_bytes([b"good"])[:-2]  # the element claims 4 bytes, 2 arrive
    request = {
        "model_name": model,
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1]}],
        "raw_input_contents": [base64.b64encode(raw).decode()],
    }
    error = triton.error(op="stub", method="ModelInfer", request=request)
    assert error["status"] == INVALID
    assert "'TEXT': raw_input_contents is malformed" in error["message"]
    assert "declares 4 bytes but only 2 remain" in error["message"]


def test_truncate_false_refuses_an_over_long_text(
    triton: TritonWorker, server: RunningServer, model: str
) -> None:
    limit = server.server.repository.get().max_length
    long_text = " ".join(["good"] * (limit + 5))
    refused = triton.error(
        op="infer", model=model, inputs=[text_input([long_text])], parameters={"truncate": False}
    )
    assert refused["status"] == INVALID
    assert re.search(
        rf"^input tensor 'TEXT': texts\[0\] is \d+ tokens long; .* at most {limit}\b",
        refused["message"],
    ), refused["message"]
    triton.ok(op="infer", model=model, inputs=[text_input([long_text])])  # truncated by default


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("no-such-model", "", "model 'no-such-model' not found"),
        (None, "99", "has no version 99"),
        (None, "latest", "has no version 'latest'"),
    ],
)
def test_unknown_model_or_version_is_not_found(
    triton: TritonWorker, model: str, name: str | None, version: str, message: str
) -> None:
    error = triton.error(
        op="infer", model=name or model, version=version, inputs=[text_input(["good"])]
    )
    assert error["status"] == "StatusCode.NOT_FOUND"
    assert message in error["message"]
    metadata = triton.error(
        op="call",
        method="get_model_metadata",
        kwargs={"model_name": name or model, "model_version": version},
    )
    assert metadata["status"] == "StatusCode.NOT_FOUND"
