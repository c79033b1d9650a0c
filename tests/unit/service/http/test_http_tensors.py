"""KServe v2 REST bodies <-> OIP messages (service/http/tensors.py): JSON and binary inputs
become the ModelInferRequest the gRPC path checks; malformed bodies are ValidationErrors that
name the problem, never a crash; outputs are rendered JSON or binary as asked."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from textserve.service.dataplane.oip_codec import decode_request, encode_response, pack_bytes
from textserve.service.errors import ValidationError
from textserve.service.http.jsonify import to_json
from textserve.service.http.tensors import parse_infer, render_infer
from textserve.v1 import classifier_pb2 as pb

TEXT = {"name": "TEXT", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}


def body(document: object) -> bytes:
    return json.dumps(document).encode()


def test_json_and_binary_inputs_decode_to_the_same_texts() -> None:
    message, binary = parse_infer(body({"inputs": [TEXT]}), None, "m", "1")
    assert decode_request(message).texts == ["a", "b"] and binary == {"": False}
    raw = pack_bytes([b"a", b"b"])
    header = body(
        {
            "inputs": [{**TEXT, "data": None, "parameters": {"binary_data_size": len(raw)}}],
            "parameters": {"binary_data_output": True},
        }
    ).replace(b', "data": null', b"")
    message, binary = parse_infer(header + raw, len(header), "m", "1")
    decoded = decode_request(message)
    assert decoded.texts == ["a", "b"] and binary == {"": True}
    nested = {**TEXT, "shape": [2, 1], "data": [["a"], ["b"]]}
    assert decode_request(parse_infer(body({"inputs": [nested]}), None, "m", "")[0]).column


@pytest.mark.parametrize(
    ("payload", "header", "says"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "JSON object"),
        (body({"inputs": "TEXT"}), None, "`inputs` must be a list"),
        (body({"inputs": [{"shape": [1]}]}), None, "needs a `name`"),
        (body({"inputs": [{**TEXT, "shape": "2"}]}), None, "shape must be a list"),
        (body({"inputs": [{**TEXT, "shape": [-1]}]}), None, "shape must be a list"),
        (body({"inputs": [{**TEXT, "data": [1, 2]}]}), None, "BYTES data must be strings"),
        (body({"inputs": [{**TEXT, "data": None}]}), None, "has no `data`"),
        (body({"inputs": [TEXT], "id": 7}), None, "`id` must be a string"),
        (body({"inputs": [TEXT], "parameters": {"x": [1]}}), None, "bool, number or string"),
        (body({"inputs": [TEXT]}), 10**6, "larger than the body"),
        (body({"inputs": [TEXT]}) + b"extra", None, "not valid JSON"),
        (
            body({"inputs": [{**TEXT, "parameters": {"binary_data_size": 99}}]}),
            None,
            "does not fit",
        ),
        (body({"inputs": [TEXT], "outputs": [{"id": 1}]}), None, "needs a `name`"),
    ],
)
def test_malformed_bodies_are_named_validation_errors(
    payload: bytes, header: int | None, says: str
) -> None:
    with pytest.raises(ValidationError, match=says):
        parse_infer(payload, header, "m", "1")


def test_binary_data_left_over_is_refused() -> None:
    header = body({"inputs": [TEXT]})
    with pytest.raises(ValidationError, match="byte\\(s\\) of binary data"):
        parse_infer(header + b"tail", len(header), "m", "1")


def test_outputs_render_as_json_or_binary_as_asked() -> None:
    request = {
        "inputs": [TEXT],
        "outputs": [{"name": "SCORE", "parameters": {"binary_data": True}}],
    }
    message, binary = parse_infer(
        body({**request, "outputs": request["outputs"] + [{"name": "LABEL"}]}), None, "m", "1"
    )
    decoded = decode_request(message)
    probabilities = np.array([[0.25, 0.75], [0.9, 0.1]], dtype=np.float32)
    response = encode_response(
        decoded, probabilities, ["neg", "pos"], model_name="m", model_version="1"
    )
    rendered, length = render_infer(response, binary)
    document = json.loads(rendered[:length])
    score, label = document["outputs"]
    assert score["parameters"]["binary_data_size"] == 8 and "data" not in score
    assert struct.unpack("<2f", rendered[length:]) == (0.75, pytest.approx(0.9))
    assert label["data"] == ["pos", "neg"]


def test_to_json_keeps_integers_and_zero_fields() -> None:
    response = pb.ClassifyResponse(model="m", model_version=2**40)
    response.results.add(label="x")
    document = to_json(response)
    assert document["model_version"] == 2**40  # a number, not protobuf JSON's string
    assert document["results"][0]["score"] == 0.0 and "timing" not in document
