"""Hostile input against a real server through textserve.v1 (and raw bytes to both APIs):
property-based (hypothesis) random texts and request shapes, undecodable and invalid-UTF-8
messages, 1 MB texts, message size limits. (The Open Inference Protocol:
test_hardening_oip_input.py.)

Every input gets a prompt, specific status — INVALID_ARGUMENT / NOT_FOUND, or OK with the right
answer (checked against the model run alone in-process) — never INTERNAL, never a hang (every
call has a deadline, and DEADLINE_EXCEEDED fails the test), and the next good request is
answered correctly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.hostile import (
    FUZZ,
    GOOD,
    INVALID,
    MAX_TEXTS,
    MB,
    NOT_FOUND,
    OK,
    TIMEOUT,
    Reference,
    assert_still_serving,
    call,
    content,
    reference_for,
    texts_strategy,
)
from tests.serving import RunningServer, running_server
from textserve.cli import main as cli_main
from textserve.client import Client
from textserve.oip import grpc_service_pb2 as ipb
from textserve.oip import grpc_service_pb2_grpc as ipb_grpc
from textserve.service.dataplane.oip_codec import pack_bytes
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc


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


@st.composite
def classify_requests(draw: st.DrawFn, name: str, version: int) -> pb.ClassifyRequest:
    """Three in four well-formed (random texts to the right model), the rest anything."""
    if draw(st.integers(0, 3)):
        texts = draw(st.lists(content, min_size=1, max_size=MAX_TEXTS))
        model, number = draw(st.sampled_from(["", name])), draw(st.sampled_from([0, version]))
    else:
        texts = draw(st.lists(texts_strategy, max_size=MAX_TEXTS + 2))
        model = draw(st.one_of(st.sampled_from(["", name]), st.text(max_size=10)))
        number = draw(st.one_of(st.sampled_from([0, version]), st.integers(-(2**63), 2**63 - 1)))
    request = pb.ClassifyRequest(
        id=draw(st.text(max_size=10)),
        texts=texts,
        model=model,
        version=number,
        top_k=draw(st.one_of(st.integers(0, 4), st.integers(0, 2**32 - 1))),
        all_scores=True,
    )
    truncate = draw(st.sampled_from([None, True, None, True, False]))
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
    print(f"\nClassify, 60 random requests: {seen}")
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
    real = handle.runner.tokenization.tokenizer
    lengths: list[int] = []

    class Watching:
        def encode_batch(self, texts: list[str]) -> Any:
            lengths.extend(len(t) for t in texts)
            return real.encode_batch(texts)

        def encode_batch_fast(self, texts: list[str]) -> Any:  # what serving calls
            lengths.extend(len(t) for t in texts)
            return real.encode_batch_fast(texts)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    handle.runner.tokenization.tokenizer = Watching()  # type: ignore[assignment]
    try:
        request = pb.ClassifyRequest(texts=[HUGE["words"], HUGE["one-1MB-token"], GOOD])
        pb_grpc.ClassifierStub(channel).Classify(request, timeout=TIMEOUT)
    finally:
        handle.runner.tokenization.tokenizer = real
    assert sorted(lengths) == [len(GOOD), reference.max_chars, reference.max_chars]


# -- message size ---------------------------------------------------------------------------------


def test_messages_over_the_limit_get_resource_exhausted(
    tiny_repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
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
        lines = tmp_path / "texts.txt"
        lines.write_text(("a gripping film " * 1000 + "\n") * 20)  # 16 kB a line
        argv = ["classify", "--server", srv.address, "--json", "--file", str(lines)]
        assert cli_main(argv) == 2
        assert "send fewer texts per request with --batch-size" in capsys.readouterr().err
        assert cli_main([*argv, "--batch-size", "2"]) == 0


def test_the_default_limit_is_4_mib(channel: grpc.Channel, reference: Reference) -> None:
    stub = pb_grpc.ClassifierStub(channel)
    code, _, details = call(stub.Classify, pb.ClassifyRequest(texts=["x" * (4 * 1024 * 1024)]))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "4194304" in details
    code, _, details = call(stub.Classify, pb.ClassifyRequest(texts=["x" * MB] * 3))
    assert code == OK, details
    assert_still_serving(channel, reference)
