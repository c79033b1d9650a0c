"""Hostile input against a real server, on both APIs: property-based (hypothesis) random texts
and request shapes, undecodable and invalid-UTF-8 messages, 1 MB texts, message size limits.

Every input gets a prompt, specific status — INVALID_ARGUMENT / NOT_FOUND, or OK with the right
answer (checked against the model run alone in-process) — never INTERNAL, never a hang (every
call has a deadline, and DEADLINE_EXCEEDED fails the test), and the next good request is
answered correctly.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from inference import grpc_service_pb2 as ipb
from inference import grpc_service_pb2_grpc as ipb_grpc
from service.client import Client
from service.manifest import Manifest
from service.model import MAX_CHARS_PER_TOKEN
from service.servicers.oip_codec import OUTPUT_NAMES, pack_bytes
from tests.serving import RunningServer, running_server
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

MAX_TEXTS = 8  # texts per request on the test server: random shapes cross the limit often
TIMEOUT = 30.0  # seconds: a call that takes this long is a hang
MB = 1_000_000
GOOD = "a gripping, beautifully acted film"
FUZZ = settings(
    max_examples=60,
    deadline=None,  # a shared 2-core CI machine: timing belongs to benchmarks
    derandomize=True,  # the same examples on every run: CI failures reproduce
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND


@dataclass
class Reference:
    """The model run alone, in-process: what the server must answer for a text."""

    tokenizer: Tokenizer
    session: onnxruntime.InferenceSession
    manifest: Manifest
    unk: int

    @property
    def max_chars(self) -> int:
        return MAX_CHARS_PER_TOKEN * self.manifest.max_length

    def ids(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text[: self.max_chars]).ids
        return ids[: self.manifest.max_length] or [self.unk]

    def too_long(self, text: str) -> bool:
        """Refused with truncate=false."""
        if len(text) > self.max_chars:
            return True
        return len(self.tokenizer.encode(text).ids) > self.manifest.max_length

    def probabilities(self, texts: Sequence[str]) -> np.ndarray:
        rows = []
        for text in texts:
            ids = np.array([self.ids(text)], dtype=np.int64)
            (logits,) = self.session.run(
                ["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            )
            exp = np.exp(logits[0] - logits[0].max())
            rows.append(exp / exp.sum())
        return np.array(rows, dtype=np.float32)


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> Iterator[RunningServer]:
    with running_server(tiny_repository, max_texts_per_request=MAX_TEXTS) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference(server: RunningServer) -> Reference:
    handle = server.server.repository.get()
    tokenizer = Tokenizer.from_file(str(handle.path / "tokenizer.json"))
    session = onnxruntime.InferenceSession(
        str(handle.path / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    return Reference(tokenizer, session, handle.manifest, tokenizer.token_to_id("[UNK]"))


@pytest.fixture(scope="module")
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    with server.channel() as channel:
        yield channel


def call(fn: Any, request: Any) -> tuple[grpc.StatusCode, Any, str]:
    try:
        return OK, fn(request, timeout=TIMEOUT), ""
    except grpc.RpcError as exc:
        return exc.code(), None, exc.details() or ""


def assert_still_serving(channel: grpc.Channel, reference: Reference) -> None:
    response = pb_grpc.ClassifierStub(channel).Classify(
        pb.ClassifyRequest(texts=[GOOD], all_scores=True), timeout=TIMEOUT
    )
    np.testing.assert_allclose(
        list(response.results[0].scores), reference.probabilities([GOOD])[0], atol=1e-5
    )


# -- strategies -----------------------------------------------------------------------------------


def _alphabet(*ranges: tuple[int, int]) -> st.SearchStrategy[str]:
    return st.one_of(*(st.characters(min_codepoint=a, max_codepoint=b) for a, b in ranges))


CONTROL = st.characters(categories=["Cc", "Cf", "Zs", "Zl", "Zp"])  # incl. NUL, BOM, ZWJ, RLO
EMOJI = _alphabet((0x1F300, 0x1FAFF), (0x2600, 0x27BF), (0xFE0F, 0xFE0F), (0x200D, 0x200D))
RTL = _alphabet((0x0590, 0x05FF), (0x0600, 0x06FF), (0x202A, 0x202E), (0x2066, 0x2069))
COMBINING = _alphabet((0x0300, 0x036F), (0x0041, 0x005A))

texts_strategy = st.one_of(
    st.text(max_size=120),  # any Unicode but surrogates (which UTF-8 cannot carry)
    st.text(CONTROL, max_size=40),
    st.text(EMOJI, max_size=60),
    st.text(RTL, max_size=80),
    st.text(COMBINING, max_size=80),
    st.sampled_from(["", " ", "\t\n", "\u3000", "\x00", "\ufeff", "[PAD]", "[UNK] [UNK]"]),
    st.builds(lambda c, n: c * n, st.characters(), st.integers(1, 5000)),  # one long "token"
    st.builds(" ".join, st.lists(st.sampled_from(GOOD.split()), max_size=200)),  # many tokens
)


@st.composite
def classify_requests(draw: st.DrawFn, name: str, version: int) -> pb.ClassifyRequest:
    request = pb.ClassifyRequest(
        id=draw(st.text(max_size=10)),
        texts=draw(st.lists(texts_strategy, max_size=MAX_TEXTS + 2)),
        model=draw(st.one_of(st.sampled_from(["", name]), st.text(max_size=10))),
        version=draw(st.one_of(st.sampled_from([0, version]), st.integers(-(2**63), 2**63 - 1))),
        top_k=draw(st.one_of(st.integers(0, 4), st.integers(0, 2**32 - 1))),
        all_scores=True,
    )
    truncate = draw(st.sampled_from([None, True, False]))
    if truncate is not None:
        request.truncate = truncate
    return request


def expected_code(request: pb.ClassifyRequest, name: str, version: int, ref: Reference) -> Any:
    """What the server must answer: the model first, then the texts (as Classify checks)."""
    if request.model not in ("", name) or request.version not in (0, version):
        return NOT_FOUND
    texts = list(request.texts)
    if not texts or len(texts) > MAX_TEXTS or any(not t or t.isspace() for t in texts):
        return INVALID
    if request.HasField("truncate") and not request.truncate and any(map(ref.too_long, texts)):
        return INVALID
    return OK


# -- textserve.v1 ---------------------------------------------------------------------------------


def test_random_classify_requests_get_specific_answers(
    server: RunningServer, channel: grpc.Channel, reference: Reference
) -> None:
    handle = server.server.repository.get()
    stub = pb_grpc.ClassifierStub(channel)
    labels = list(handle.labels)
    seen: dict[str, int] = {}

    @FUZZ
    @given(classify_requests(handle.name, handle.version))
    def check(request: pb.ClassifyRequest) -> None:
        code, response, details = call(stub.Classify, request)
        assert code == expected_code(request, handle.name, handle.version, reference), details
        seen[code.name] = seen.get(code.name, 0) + 1
        if code == OK:
            texts = list(request.texts)
            expected = reference.probabilities(texts)
            got = np.array([list(r.scores) for r in response.results], dtype=np.float32)
            np.testing.assert_allclose(got, expected, atol=1e-5)
            assert [r.label for r in response.results] == [labels[i] for i in got.argmax(1)]
            assert all(r.num_tokens <= handle.max_length for r in response.results)
            assert len(response.results[0].top) == min(request.top_k, len(labels))
        assert_still_serving(channel, reference)

    check()
    assert seen.get("OK") and seen.get("INVALID_ARGUMENT") and seen.get("NOT_FOUND"), seen


@FUZZ
@given(payload=st.binary(max_size=300))
def test_random_bytes_as_a_message_are_invalid_argument_or_answered(
    channel: grpc.Channel, reference: Reference, payload: bytes
) -> None:
    for method in (
        "/textserve.v1.Classifier/Classify",
        "/inference.GRPCInferenceService/ModelInfer",
    ):
        code, _, details = call(channel.unary_unary(method), payload)  # raw bytes, no serializer
        assert code in (OK, INVALID, NOT_FOUND), (method, code, details)
    assert_still_serving(channel, reference)


def _string_field(number: int, data: bytes) -> bytes:
    """One length-delimited protobuf field, hand-encoded (any bytes, valid UTF-8 or not)."""
    assert len(data) < 128
    return bytes([(number << 3) | 2, len(data)]) + data


@pytest.mark.parametrize(
    "data",
    [b"\xff\xfe", b"\xed\xa0\x80", b"caf\xc3", b"\xc0\xaf"],
    ids=["not-utf8", "lone-surrogate", "cut-sequence", "overlong"],
)
def test_invalid_utf8_in_a_string_field_is_invalid_argument(
    channel: grpc.Channel, reference: Reference, data: bytes
) -> None:
    texts = pb.ClassifyRequest.DESCRIPTOR.fields_by_name["texts"].number
    payload = _string_field(texts, b"fine") + _string_field(texts, data)
    code, _, details = call(channel.unary_unary("/textserve.v1.Classifier/Classify"), payload)
    assert code == INVALID
    assert "not a valid protobuf message" in details
    stream = channel.stream_stream("/textserve.v1.Classifier/ClassifyStream")
    good = pb.ClassifyRequest(id="good", texts=[GOOD]).SerializeToString()
    with pytest.raises(grpc.RpcError) as info:
        list(stream(iter([good, payload]), timeout=TIMEOUT))  # ends, does not hang
    assert info.value.code() == INVALID
    assert "message 1 of the request stream" in (info.value.details() or "")
    assert_still_serving(channel, reference)


def test_the_client_library_names_a_text_with_a_lone_surrogate() -> None:
    # The Python protobuf runtime cannot even serialize one; the client says which text it is.
    with pytest.raises(UnicodeEncodeError):
        pb.ClassifyRequest(texts=["\ud800"]).SerializeToString()
    with Client("127.0.0.1:1") as client, pytest.raises(ValueError, match=r"texts\[1\] is not"):
        client.classify(["fine", "bad \udcff here"])


def test_a_stream_answers_good_requests_and_reports_bad_ones(
    channel: grpc.Channel, reference: Reference
) -> None:
    requests = [
        pb.ClassifyRequest(id="1", texts=[GOOD]),
        pb.ClassifyRequest(id="2", texts=[""]),
        pb.ClassifyRequest(id="3", texts=["x"] * (MAX_TEXTS + 1)),
        pb.ClassifyRequest(id="4", texts=["\x00\u202e" * 50], model="nope"),
        pb.ClassifyRequest(id="5", texts=[GOOD, "ok"]),
    ]
    stub = pb_grpc.ClassifierStub(channel)
    responses = {r.id: r for r in stub.ClassifyStream(iter(requests), timeout=TIMEOUT)}
    assert sorted(responses) == ["1", "2", "3", "4", "5"]
    codes = {k: r.error.code if r.HasField("error") else 0 for k, r in responses.items()}
    assert codes["1"] == codes["5"] == 0
    assert codes["2"] == codes["3"] == INVALID.value[0]
    assert codes["4"] == NOT_FOUND.value[0]


# -- 1 MB texts -----------------------------------------------------------------------------------

HUGE = {
    "words": ("gripping film " * (MB // 14 + 1))[:MB],
    "one-1MB-token": "x" * MB,
    "one-100k-token": "abcdefghij" * 10_000,
    "emoji-4-bytes-each": "😀" * (MB // 4),
    "rtl": ("שלום עולם مرحبا \u202e" * (MB // 17 + 1))[:MB],
    "combining-marks": ("a\u0301\u0302\u0303" * (MB // 4 + 1))[:MB],
    "controls-only": "\x01\x02\x7f" * (MB // 3),
    "spaces-then-a-word": " " * (MB - 5) + "film",
}


@pytest.mark.parametrize("kind", sorted(HUGE))
def test_one_megabyte_texts_are_truncated_and_answered(
    server: RunningServer, channel: grpc.Channel, reference: Reference, kind: str
) -> None:
    text = HUGE[kind]
    handle = server.server.repository.get()
    stub = pb_grpc.ClassifierStub(channel)
    code, response, details = call(stub.Classify, pb.ClassifyRequest(texts=[text], all_scores=True))
    assert code == OK, details
    (result,) = response.results
    np.testing.assert_allclose(list(result.scores), reference.probabilities([text])[0], atol=1e-5)
    assert result.truncated and 1 <= result.num_tokens <= handle.max_length
    refused = pb.ClassifyRequest(texts=[text], truncate=False)
    code, _, details = call(stub.Classify, refused)
    assert code == INVALID and "texts[0] is" in details, details
    assert_still_serving(channel, reference)


def test_the_tokenizer_never_sees_more_than_the_character_cap(
    server: RunningServer, channel: grpc.Channel, reference: Reference
) -> None:
    # Responsiveness by construction: tokenizing is linear in characters, so a text's cost is
    # bounded by the cap, not by its size. Watch what reaches the tokenizer.
    handle = server.server.repository.get()
    real = handle._tokenizer
    lengths: list[int] = []

    class Watching:
        def encode_batch(self, texts: list[str]) -> Any:
            lengths.extend(len(t) for t in texts)
            return real.encode_batch(texts)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    handle._tokenizer = Watching()  # type: ignore[assignment]
    try:
        request = pb.ClassifyRequest(texts=[HUGE["words"], HUGE["one-1MB-token"], GOOD])
        pb_grpc.ClassifierStub(channel).Classify(request, timeout=TIMEOUT)
    finally:
        handle._tokenizer = real
    assert sorted(lengths) == [len(GOOD), reference.max_chars, reference.max_chars]


# -- message size ---------------------------------------------------------------------------------


def test_messages_over_the_limit_get_resource_exhausted(tiny_repository: Path) -> None:
    limit = 64 * 1024
    with running_server(tiny_repository, max_message_bytes=limit) as srv, srv.channel() as ch:
        stub = pb_grpc.ClassifierStub(ch)
        oip = ipb_grpc.GRPCInferenceServiceStub(ch)
        big = "word " * (limit // 5 + 10)
        code, _, details = call(stub.Classify, pb.ClassifyRequest(texts=[big]))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in details and str(limit) in details
        infer = ipb.ModelInferRequest(
            inputs=[
                ipb.ModelInferRequest.InferInputTensor(name="TEXT", datatype="BYTES", shape=[1])
            ],
            raw_input_contents=[pack_bytes([big.encode()])],
        )
        code, _, _ = call(oip.ModelInfer, infer)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        code, _, _ = call(stub.Classify, pb.ClassifyRequest(texts=[big[: limit // 2]]))
        assert code == OK  # under the limit: served, and the server goes on


def test_the_default_limit_is_4_mib(channel: grpc.Channel, reference: Reference) -> None:
    stub = pb_grpc.ClassifierStub(channel)
    code, _, details = call(stub.Classify, pb.ClassifyRequest(texts=["x" * (4 * 1024 * 1024)]))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "4194304" in details
    code, _, details = call(stub.Classify, pb.ClassifyRequest(texts=["x" * MB] * 3))
    assert code == OK, details
    assert_still_serving(channel, reference)


# -- the Open Inference Protocol ------------------------------------------------------------------

DATATYPES = ["BYTES", "FP32", "INT64", "BOOL", "STRING", "", "bytes"]
byte_items = st.one_of(
    texts_strategy.map(lambda t: t.encode()),
    st.binary(max_size=40),  # mostly invalid UTF-8
    st.sampled_from([b"\xff", b"\xed\xa0\x80", b"ok \xc3", b""]),
)


@st.composite
def infer_requests(draw: st.DrawFn, name: str) -> ipb.ModelInferRequest:
    """Requests of every shape: right and wrong names, datatypes, shapes, contents, framing,
    outputs and parameters."""
    request = ipb.ModelInferRequest(
        model_name=draw(st.one_of(st.sampled_from([name, ""]), st.text(max_size=8))),
        model_version=draw(st.sampled_from(["", "1", "0", "-1", "x", "99999999999999999999"])),
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
    @given(infer_requests(handle.name))
    def check(request: ipb.ModelInferRequest) -> None:
        code, response, details = call(oip.ModelInfer, request)
        assert code in (OK, INVALID, NOT_FOUND), (code, details)
        seen[code.name] = seen.get(code.name, 0) + 1
        if code == OK:  # then it was a valid request: the answer must be right
            (tensor,) = request.inputs
            items = (
                list(tensor.contents.bytes_contents)
                if tensor.contents.bytes_contents
                else _unpack(request.raw_input_contents[0])
            )
            texts = [b.decode() for b in items]
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
    assert seen.get("OK") and seen.get("INVALID_ARGUMENT") and seen.get("NOT_FOUND"), seen


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
