"""Unit tests of the Open Inference Protocol codec: framing, validation, output encoding."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from textserve.oip import grpc_service_pb2 as pb
from textserve.service.dataplane.oip_codec import (
    OUTPUT_NAMES,
    DecodedRequest,
    decode_request,
    encode_response,
    pack_bytes,
    unpack_bytes,
)
from textserve.service.errors import ValidationError

LABELS = ["negative", "positive"]


def raw_request(
    texts: list[str], shape: list[int] | None = None, **kwargs: object
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", **kwargs)  # type: ignore[arg-type]
    request.inputs.add(name="TEXT", datatype="BYTES", shape=shape or [len(texts)])
    request.raw_input_contents.append(pack_bytes([t.encode() for t in texts]))
    return request


def typed_request(texts: list[str], shape: list[int] | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=shape or [len(texts)])
    tensor.contents.bytes_contents.extend(t.encode() for t in texts)
    return request


def decoded(texts: list[str], *, column: bool = False, raw: bool = True, outputs=OUTPUT_NAMES):
    return DecodedRequest(
        texts=texts, column=column, outputs=tuple(outputs), raw=raw, truncate=None, request_id="r"
    )


# -- framing ---------------------------------------------------------------------------------


@given(st.lists(st.binary(max_size=40), max_size=8))
def test_pack_then_unpack_gives_the_items_back(items: list[bytes]) -> None:
    assert unpack_bytes(pack_bytes(items), len(items)) == items


def test_pack_uses_four_byte_little_endian_lengths() -> None:
    assert pack_bytes([b"ab", b""]) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"


@pytest.mark.parametrize(
    ("raw", "count", "problem"),
    [
        (b"\x05\x00\x00\x00abc", 1, "declares 5 bytes but only 3 remain"),
        (b"\x01\x00\x00\x00a\x02\x00", 2, "element 1 has a truncated 4-byte length prefix"),
        (pack_bytes([b"a", b"b"]), 1, "holds 2 element(s) but the shape needs 1"),
        (pack_bytes([b"a"]), 3, "holds 1 element(s) but the shape needs 3"),
    ],
)
def test_malformed_framing_is_named(raw: bytes, count: int, problem: str) -> None:
    with pytest.raises(ValidationError, match="'TEXT'") as info:
        unpack_bytes(raw, count)
    assert problem in str(info.value)


# -- decoding --------------------------------------------------------------------------------


def test_decodes_raw_input_as_tritonclient_frames_it() -> None:
    request = raw_request(["good film", "héllo"], id="req-7")
    request.parameters["truncate"].bool_param = False
    got = decode_request(request)
    assert got == DecodedRequest(
        texts=["good film", "héllo"],
        column=False,
        outputs=OUTPUT_NAMES,
        raw=True,
        truncate=False,
        request_id="req-7",
    )


def test_decodes_typed_contents_and_column_shape() -> None:
    got = decode_request(typed_request(["a", "b", "c"], shape=[3, 1]))
    assert got.texts == ["a", "b", "c"]
    assert got.column and not got.raw and got.truncate is None


def test_requested_outputs_keep_their_order() -> None:
    request = raw_request(["a"])
    request.outputs.add(name="SCORE")
    request.outputs.add(name="LABEL")
    assert decode_request(request).outputs == ("SCORE", "LABEL")


def _with(request: pb.ModelInferRequest, change) -> pb.ModelInferRequest:
    change(request)
    return request


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (pb.ModelInferRequest(model_name="m"), "input tensor 'TEXT' is missing"),
        (
            _with(raw_request(["a"]), lambda r: setattr(r.inputs[0], "name", "INPUT0")),
            "unexpected input tensor 'INPUT0'",
        ),
        (
            _with(raw_request(["a"]), lambda r: setattr(r.inputs[0], "datatype", "FP32")),
            "input tensor 'TEXT': datatype must be BYTES, got FP32",
        ),
        (raw_request(["a", "b"], shape=[3]), "holds 2 element(s) but the shape needs 3"),
        (raw_request(["a", "b"], shape=[1, 2]), "shape must be [n] or [n, 1], got [1, 2]"),
        (raw_request(["a"], shape=[1, 1, 1]), "shape must be [n] or [n, 1], got [1, 1, 1]"),
        (raw_request([], shape=[0]), "has no elements"),
        (typed_request(["a", "b"], shape=[3]), "needs 3 element(s) but contents.bytes_contents"),
        (
            _with(raw_request(["a"]), lambda r: r.outputs.add(name="LOGITS")),
            "unknown output tensor 'LOGITS'",
        ),
        (
            _with(raw_request(["a"]), lambda r: [r.outputs.add(name="SCORE") for _ in range(2)]),
            "output tensor 'SCORE' is requested more than once",
        ),
        (
            _with(
                raw_request(["a"]),
                lambda r: r.parameters["truncate"].MergeFrom(pb.InferParameter(string_param="y")),
            ),
            "parameter 'truncate' must be a bool (bool_param), got string_param",
        ),
        (
            _with(raw_request(["a"]), lambda r: r.raw_input_contents.append(b"")),
            "raw_input_contents has 2 entries",
        ),
        (
            _with(raw_request(["a"]), lambda r: r.inputs[0].contents.bytes_contents.append(b"a")),
            "either in contents or in raw_input_contents",
        ),
    ],
)
def test_bad_requests_get_a_specific_message(request_: pb.ModelInferRequest, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        decode_request(request_)
    assert message in str(info.value)


def test_fp32_data_for_text_gets_a_hint() -> None:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[1])
    tensor.contents.fp32_contents.append(1.0)
    with pytest.raises(ValidationError, match="not in fp32_contents"):
        decode_request(request)


@pytest.mark.parametrize("raw", [True, False])
def test_invalid_utf8_names_tensor_and_element(raw: bool) -> None:
    request = raw_request(["ok"], shape=[2]) if raw else typed_request(["ok"], shape=[2])
    if raw:
        request.raw_input_contents[0] += pack_bytes([b"\xff\xfe"])
    else:
        request.inputs[0].contents.bytes_contents.append(b"\xff\xfe")
    with pytest.raises(ValidationError, match=r"'TEXT': element 1 is not valid UTF-8"):
        decode_request(request)


# -- encoding --------------------------------------------------------------------------------

PROBS = np.array([[0.9, 0.1], [0.25, 0.75]], dtype=np.float32)


def test_raw_response_is_what_tritonclient_reads() -> None:
    response = encode_response(
        decoded(["x", "y"]), PROBS, LABELS, model_name="m", model_version="3"
    )
    assert (response.model_name, response.model_version, response.id) == ("m", "3", "r")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("LABEL", "BYTES", [2]),
        ("SCORE", "FP32", [2]),
        ("PROBABILITIES", "FP32", [2, 2]),
    ]
    label, score, probs = response.raw_output_contents
    assert unpack_bytes(label, 2, "LABEL") == [b"negative", b"positive"]
    assert struct.unpack("<2f", score) == pytest.approx((0.9, 0.75))
    assert np.frombuffer(probs, "<f4").reshape(2, 2).tolist() == PROBS.tolist()
    assert not any(o.HasField("contents") for o in response.outputs)


def test_typed_response_subset_and_column_shape() -> None:
    request = decoded(["x", "y"], column=True, raw=False, outputs=["SCORE", "LABEL"])
    response = encode_response(request, PROBS.tolist(), LABELS, model_name="m", model_version="1")
    assert not response.raw_output_contents
    score, label = response.outputs
    assert (score.name, list(score.shape)) == ("SCORE", [2, 1])
    assert list(score.contents.fp32_contents) == pytest.approx([0.9, 0.75])
    assert list(label.contents.bytes_contents) == [b"negative", b"positive"]


def test_probabilities_of_the_wrong_shape_are_a_bug_not_bad_input() -> None:
    with pytest.raises(ValueError, match="expected"):
        encode_response(decoded(["x"]), PROBS, LABELS, model_name="m", model_version="1")


# The exact messages: they are the gRPC details an OIP client reads (`make mutate` found every
# one of them free to change unnoticed).
def _tensor_request(datatype: str = "BYTES", count: int = 1) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    for _ in range(count):
        request.inputs.add(name="TEXT", datatype=datatype, shape=[1])
    return request


def _message(request: pb.ModelInferRequest) -> str:
    with pytest.raises(ValidationError) as info:
        decode_request(request)
    return str(info.value)


def test_decode_errors_say_exactly_what_is_wrong() -> None:
    assert _message(_tensor_request(count=2)) == "input tensor 'TEXT' is given 2 times"
    assert _message(_tensor_request(datatype="")) == (
        "input tensor 'TEXT': datatype must be BYTES, got none"
    )
    unknown = typed_request(["a"])
    unknown.outputs.add(name="LOGITS")
    assert _message(unknown) == (
        "unknown output tensor 'LOGITS'; the model's outputs are LABEL, SCORE, PROBABILITIES"
    )
    no_value = typed_request(["a"])
    no_value.parameters["truncate"].SetInParent()
    assert _message(no_value) == "parameter 'truncate' must be a bool (bool_param), got no value"


def test_a_count_mismatch_hints_at_typed_contents_only_when_some_were_sent() -> None:
    plain = typed_request(["a"], shape=[2])
    assert _message(plain) == (
        "input tensor 'TEXT': shape [2] needs 2 element(s) but contents.bytes_contents has 1"
    )
    typed = _tensor_request()
    typed.inputs[0].contents.int_contents.append(1)
    typed.inputs[0].contents.fp32_contents.append(1.0)
    assert _message(typed) == (
        "input tensor 'TEXT': shape [1] needs 1 element(s) but contents.bytes_contents has 0; "
        "BYTES data goes there, not in int_contents, fp32_contents"
    )


def test_a_truncated_length_prefix_says_how_many_bytes_are_left() -> None:
    with pytest.raises(ValidationError) as info:
        unpack_bytes(pack_bytes([b"ab"]) + b"\x01\x00", 2)
    assert str(info.value) == (
        "input tensor 'TEXT': raw_input_contents is malformed: element 1 has a truncated 4-byte "
        "length prefix (2 byte(s) left)"
    )
