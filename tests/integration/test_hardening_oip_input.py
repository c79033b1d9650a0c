"""Hostile input against a real server through the Open Inference Protocol
(inference.GRPCInferenceService, raw stubs of the generated `inference` package): random request
shapes — right and wrong tensor names, datatypes, shapes, contents, framing, outputs and
parameters — and invalid UTF-8 in BYTES tensors. Each gets INVALID_ARGUMENT / NOT_FOUND or the
right answer, never INTERNAL or a hang, and the server then answers a good request correctly.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.hostile import (
    FUZZ,
    INVALID,
    MAX_TEXTS,
    NOT_FOUND,
    OK,
    Reference,
    assert_still_serving,
    call,
    content,
    reference_for,
    texts_strategy,
)
from tests.serving import RunningServer, running_server
from textserve.oip import grpc_service_pb2 as ipb
from textserve.oip import grpc_service_pb2_grpc as ipb_grpc
from textserve.service.dataplane.oip_codec import OUTPUT_NAMES, pack_bytes


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> Iterator[RunningServer]:
    with running_server(tiny_repository, max_texts_per_request=MAX_TEXTS) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference(server: RunningServer) -> Reference:
    return reference_for(server.server.repository.get())


@pytest.fixture(scope="module")
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    with server.channel() as channel:
        yield channel


DATATYPES = ["BYTES", "FP32", "INT64", "BOOL", "STRING", "", "bytes"]
byte_items = st.one_of(
    texts_strategy.map(lambda t: t.encode()),
    st.binary(max_size=40),  # mostly invalid UTF-8
    st.sampled_from([b"\xff", b"\xed\xa0\x80", b"ok \xc3", b""]),
)


@st.composite
def valid_infer_requests(draw: st.DrawFn, name: str, version: int) -> ipb.ModelInferRequest:
    """Well-formed requests with random texts: typed or raw, [n] or [n, 1], any outputs."""
    request = ipb.ModelInferRequest(
        model_name=draw(st.sampled_from([name, ""])),
        model_version=draw(st.sampled_from(["", str(version)])),
        id=draw(st.text(max_size=8)),
    )
    items = [t.encode() for t in draw(st.lists(content, min_size=1, max_size=MAX_TEXTS))]
    shape = [len(items), 1] if draw(st.booleans()) else [len(items)]
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=shape)
    if draw(st.booleans()):
        request.raw_input_contents.append(pack_bytes(items))
    else:
        tensor.contents.bytes_contents.extend(items)
    for output in draw(st.lists(st.sampled_from(OUTPUT_NAMES), unique=True, max_size=3)):
        request.outputs.add(name=output)
    truncate = draw(st.sampled_from([None, True, False]))
    if truncate is not None:
        request.parameters["truncate"].bool_param = truncate
    return request


@st.composite
def infer_requests(draw: st.DrawFn, name: str) -> ipb.ModelInferRequest:
    """Requests of every shape: right and wrong names, datatypes, shapes, contents, framing,
    outputs and parameters."""
    request = ipb.ModelInferRequest(
        # mostly the right model, so that most requests reach the tensors
        model_name=draw(st.sampled_from([name, "", name, "", "nope"])),
        model_version=draw(
            st.sampled_from(["", "", "", "", "1", "0", "-1", "x", "99999999999999999999"])
        ),
        id=draw(st.text(max_size=8)),
    )
    for _ in range(draw(st.integers(0, 2))):
        items = draw(st.lists(byte_items, max_size=MAX_TEXTS + 2))
        shape = draw(
            st.one_of(
                st.just([len(items)]),
                st.just([len(items), 1]),
                st.lists(st.integers(-2, MAX_TEXTS + 2), max_size=3),
                st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=2),
            )
        )
        tensor = request.inputs.add(
            name=draw(st.sampled_from(["TEXT", "TEXT", "text", "INPUT0", ""])),
            datatype=draw(st.sampled_from(DATATYPES)),
            shape=shape,
        )
        form = draw(st.sampled_from(["bytes", "raw", "raw-garbage", "int", "none"]))
        if form == "bytes":
            tensor.contents.bytes_contents.extend(items)
        elif form == "raw":
            request.raw_input_contents.append(pack_bytes(items))
        elif form == "raw-garbage":
            request.raw_input_contents.append(draw(st.binary(max_size=64)))
        elif form == "int":
            tensor.contents.int_contents.extend(range(len(items)))
    for output in draw(st.lists(st.sampled_from([*OUTPUT_NAMES, "LOGITS", ""]), max_size=4)):
        request.outputs.add(name=output)
    truncate = draw(st.sampled_from(["absent", "bool", "int", "string"]))
    if truncate == "bool":
        request.parameters["truncate"].bool_param = draw(st.booleans())
    elif truncate == "int":
        request.parameters["truncate"].int64_param = 1
    elif truncate == "string":
        request.parameters["truncate"].string_param = "true"
    return request


def _tensor(response: ipb.ModelInferResponse, name: str) -> tuple[list[int], Any]:
    index = [o.name for o in response.outputs].index(name)
    output = response.outputs[index]
    raw = response.raw_output_contents[index] if response.raw_output_contents else None
    if output.datatype == "FP32":
        values: Any = (
            np.frombuffer(raw, "<f4")
            if raw is not None
            else np.array(output.contents.fp32_contents)
        )
    else:
        values = []
        if raw is not None:
            offset = 0
            while offset < len(raw):
                (n,) = struct.unpack_from("<I", raw, offset)
                values.append(raw[offset + 4 : offset + 4 + n].decode())
                offset += 4 + n
        else:
            values = [b.decode() for b in output.contents.bytes_contents]
    return list(output.shape), values


def test_random_infer_requests_get_specific_answers(
    server: RunningServer, channel: grpc.Channel, reference: Reference
) -> None:
    handle = server.server.repository.get()
    oip = ipb_grpc.GRPCInferenceServiceStub(channel)
    seen: dict[str, int] = {}

    @settings(FUZZ, max_examples=120)
    @given(
        st.one_of(
            valid_infer_requests(handle.name, handle.version).map(lambda r: (True, r)),
            infer_requests(handle.name).map(lambda r: (False, r)),
        )
    )
    def check(case: tuple[bool, ipb.ModelInferRequest]) -> None:
        valid, request = case
        code, response, details = call(oip.ModelInfer, request)
        assert code in (OK, INVALID, NOT_FOUND), (code, details)
        if valid:
            refused = (
                request.parameters["truncate"].bool_param is False
                and any(reference.too_long(t.decode()) for t in _items(request))
                if "truncate" in request.parameters
                else False
            )
            assert code == (INVALID if refused else OK), details
        seen[code.name] = seen.get(code.name, 0) + 1
        if code == OK:  # then it was a valid request: the answer must be right
            (tensor,) = request.inputs
            texts = [b.decode() for b in _items(request)]
            expected = reference.probabilities(texts)
            names = [o.name for o in request.outputs] or list(OUTPUT_NAMES)
            assert [o.name for o in response.outputs] == names
            if "PROBABILITIES" in names:
                shape, values = _tensor(response, "PROBABILITIES")
                assert shape == [len(texts), len(handle.labels)]
                np.testing.assert_allclose(np.reshape(values, shape), expected, atol=1e-5)
            if "LABEL" in names:
                shape, values = _tensor(response, "LABEL")
                assert shape == list(tensor.shape)
                assert values == [handle.labels[i] for i in expected.argmax(1)]
        assert_still_serving(channel, reference)

    check()
    print(f"\nModelInfer, 120 random requests: {seen}")
    assert seen.get("OK") and seen.get("INVALID_ARGUMENT") and seen.get("NOT_FOUND"), seen


def _items(request: ipb.ModelInferRequest) -> list[bytes]:
    (tensor,) = request.inputs
    if request.raw_input_contents:
        return _unpack(request.raw_input_contents[0])
    return list(tensor.contents.bytes_contents)


def _unpack(raw: bytes) -> list[bytes]:
    items, offset = [], 0
    while offset < len(raw):
        (n,) = struct.unpack_from("<I", raw, offset)
        items.append(raw[offset + 4 : offset + 4 + n])
        offset += 4 + n
    return items


@pytest.mark.parametrize("raw", [False, True], ids=["bytes_contents", "raw_input_contents"])
def test_invalid_utf8_in_a_bytes_tensor_names_the_element(
    server: RunningServer, channel: grpc.Channel, reference: Reference, raw: bool
) -> None:
    items = [b"a good film", b"\xed\xa0\x80 surrogate", b"\xff"]
    request = ipb.ModelInferRequest(model_name=server.server.repository.get().name)
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[len(items)])
    if raw:
        request.raw_input_contents.append(pack_bytes(items))
    else:
        tensor.contents.bytes_contents.extend(items)
    code, _, details = call(ipb_grpc.GRPCInferenceServiceStub(channel).ModelInfer, request)
    assert code == INVALID
    assert "element 1 is not valid UTF-8" in details
    assert_still_serving(channel, reference)


def test_a_huge_declared_shape_is_refused_without_allocating(
    server: RunningServer, channel: grpc.Channel, reference: Reference
) -> None:
    request = ipb.ModelInferRequest(model_name=server.server.repository.get().name)
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[2**62, 1])
    request.raw_input_contents.append(struct.pack("<I", 2**32 - 1) + b"x")
    code, _, details = call(ipb_grpc.GRPCInferenceServiceStub(channel).ModelInfer, request)
    assert code == INVALID, details
    assert_still_serving(channel, reference)
