"""The HTTP front end (service/http/) with real clients (requests, curl) against a real server:
exact probe paths, POST /v1/classify and KServe v2 REST (JSON and the binary extension) scoring
the same as gRPC, the taxonomy's statuses with a JSON message, bearer tokens on every route
but the probes, the body limit refused before the body is read, and the Request-Timeout
deadline."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import socket
import struct
import subprocess
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.handmade import make_version
from tests.serving import RunningServer, running_server
from textserve.client import Client
from textserve.service.config import BatcherConfig, SecurityConfig
from textserve.service.errors import (
    CancelledError,
    DeadlineExceededError,
    InternalError,
    LoadFailedError,
    ModelNotFoundError,
    NotReadyError,
    OverloadedError,
    ServiceError,
    ValidationError,
)

MODEL = "handmade"
TEXTS = ["a good film", "a bad plot", "great great awful", "the film is good and the plot bad"]
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    make_version(root, MODEL, 1)
    return root


@pytest.fixture(scope="module")
def srv(repository: Path) -> Iterator[RunningServer]:
    with running_server(
        repository, metrics_port=0, batcher=BatcherConfig(max_queue_size=4)
    ) as running:
        yield running


def url(srv: RunningServer, path: str) -> str:
    return f"http://127.0.0.1:{srv.server.metrics_port}{path}"


def raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data` on a fresh connection; everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            pass
    return b"".join(chunks)


# -- the probes: exact paths and methods ----------------------------------------------------------


def test_probes_answer_only_on_their_exact_paths_and_method(srv: RunningServer) -> None:
    assert requests.get(url(srv, "/healthz"), timeout=10).text.strip() == "ok"
    assert requests.get(url(srv, "/readyz"), timeout=10).text.strip() == "serving"
    for path in ("/readyz/", "/ready", "/healthz/x", "/", "/metricsx", "/v2/health", "/nope"):
        response = requests.get(url(srv, path), timeout=10)
        assert response.status_code == 404, path
        assert "error" in response.json()
    for method in ("POST", "PUT", "DELETE"):
        response = requests.request(method, url(srv, "/readyz"), timeout=10)
        assert response.status_code == 405, method
        assert response.headers["allow"] == "GET, HEAD"
    # A bare HTTP/0.9-style request line is answered (and the connection closed), not held.
    answer = raw_exchange(srv.server.metrics_port or 0, b"GET /readyz\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"serving\n")


def test_head_answers_wherever_get_does_and_v2_with_a_slash_is_server_metadata(
    srv: RunningServer,
) -> None:
    for path in ("/healthz", "/readyz", "/v2", "/v2/", "/v2/health/live", f"/v2/models/{MODEL}"):
        got = requests.get(url(srv, path), timeout=10)
        head = requests.head(url(srv, path), timeout=10)
        assert (head.status_code, got.status_code) == (200, 200), path
        assert head.content == b"", path
        assert head.headers["content-length"] == str(len(got.content)), path
    assert (
        requests.get(url(srv, "/v2/"), timeout=10).json()
        == requests.get(url(srv, "/v2"), timeout=10).json()
    )
    assert requests.head(url(srv, "/v1/classify"), timeout=10).status_code == 405  # POST only


def test_a_non_ascii_digit_in_the_binary_header_length_is_a_400(srv: RunningServer) -> None:
    # the byte 0xB2 is '\u00b2' in latin-1: str.isdigit() passed it and int() then failed, a 500
    body = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1]}]}).encode()
    head = f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    tail = f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    for value in (b"\xb2", b"1\xb2", "\u0663".encode(), b"-1", b"1e3"):
        header = b"Inference-Header-Content-Length: " + value + b"\r\n"
        answer = raw_exchange(srv.server.metrics_port or 0, head.encode() + header + tail)
        assert answer.startswith(b"HTTP/1.1 400"), (value, answer[:200])
        assert b"inference-header-content-length must be a number" in answer.lower(), value


HOSTILE_JSON = {
    # a lone surrogate, as JSON escapes write one: no UTF-8 encoder or tokenizer takes it
    "surrogate text": (b'{"texts": ["a good film", "bad \\ud800 plot"]}', "texts[1]"),
    "surrogate pair text": (
        b'{"texts": ["a"], "text_pairs": ["\\udfff"]}',
        "text_pairs[0]",
    ),
    "surrogate id": (b'{"texts": ["a"], "id": "\\ud800"}', "`id`"),
    "nested 100,000 deep": (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
    "an integer of 5,000 digits": (b'{"texts": ["a"], "top_k": ' + b"9" * 5000 + b"}", "digits"),
}
HOSTILE_INFER = {
    "surrogate tensor name": (
        b'{"inputs": [{"name": "\\ud800", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}',
        "lone surrogate",
    ),
    "surrogate id": (
        b'{"id": "\\udc00", "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], '
        b'"data": ["a"]}]}',
        "`id`",
    ),
    "a 1 MB tensor name": (
        b'{"inputs": [{"name": "' + b"x" * 1_000_000 + b'", "datatype": "BYTES", "shape": [1],'
        b' "data": ["a"]}]}',
        "input tensor",
    ),
    "nested 100,000 deep": (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "deep"),
}


@pytest.mark.parametrize("case", list(HOSTILE_JSON))
def test_hostile_json_is_a_400_naming_the_fault_never_a_500(srv: RunningServer, case: str) -> None:
    body, named = HOSTILE_JSON[case]
    answer = requests.post(url(srv, "/v1/classify"), data=body, timeout=30)
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["code"] == "INVALID_ARGUMENT" and named in answer.json()["error"]
    assert len(answer.content) < 2000  # the fault is named, the input not echoed whole


@pytest.mark.parametrize("case", list(HOSTILE_INFER))
def test_hostile_kserve_json_is_a_400_never_a_500(srv: RunningServer, case: str) -> None:
    body, named = HOSTILE_INFER[case]
    answer = requests.post(url(srv, f"/v2/models/{MODEL}/infer"), data=body, timeout=30)
    assert answer.status_code == 400, answer.text[:300]
    assert named in answer.json()["error"]
    assert len(answer.content) < 2000


def test_metrics_and_kserve_probes(srv: RunningServer) -> None:
    page = requests.get(url(srv, "/metrics"), timeout=10)
    assert page.status_code == 200 and "textserve_queue_depth" in page.text
    assert requests.get(url(srv, "/v2/health/live"), timeout=10).json() == {"live": True}
    assert requests.get(url(srv, "/v2/health/ready"), timeout=10).json() == {"ready": True}
    ready = requests.get(url(srv, f"/v2/models/{MODEL}/versions/1/ready"), timeout=10)
    assert ready.status_code == 200
    assert requests.get(url(srv, "/v2/models/nope/ready"), timeout=10).status_code == 503
    metadata = requests.get(url(srv, f"/v2/models/{MODEL}"), timeout=10).json()
    assert metadata["name"] == MODEL and metadata["versions"] == ["1"]
    assert [i["name"] for i in metadata["inputs"]] == ["TEXT"]
    assert metadata["inputs"][0]["shape"] == [-1, 1]  # numbers, not protobuf JSON's strings
    server = requests.get(url(srv, "/v2"), timeout=10).json()
    assert server["name"] == "textserve" and "binary_tensor_data" in server["extensions"]


# -- inference: the same scores as gRPC -----------------------------------------------------------


def test_classify_and_kserve_infer_score_as_grpc(srv: RunningServer) -> None:
    with Client(srv.address) as client:
        grpc_result = client.classify(TEXTS, all_scores=True)
    expected = [p.score for p in grpc_result.predictions]
    labels = [p.label for p in grpc_result.predictions]
    body = requests.post(
        url(srv, "/v1/classify"), json={"texts": TEXTS, "top_k": 2, "all_scores": True}, timeout=10
    ).json()
    assert [r["score"] for r in body["results"]] == pytest.approx(expected, abs=0, rel=0)
    assert [r["label"] for r in body["results"]] == labels
    assert body["model"] == MODEL and body["model_version"] == 1
    assert all(len(r["top"]) == 2 and len(r["scores"]) == 2 for r in body["results"])
    assert set(body["timing"]) >= {"queue_seconds", "inference_seconds", "total_seconds"}
    # A KServe v2 REST request written from the spec, no client library.
    request = {
        "id": "r1",
        "inputs": [{"name": "TEXT", "shape": [len(TEXTS)], "datatype": "BYTES", "data": TEXTS}],
        "outputs": [{"name": "LABEL"}, {"name": "SCORE"}],
    }
    answer = requests.post(url(srv, f"/v2/models/{MODEL}/infer"), json=request, timeout=10)
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o for o in answer.json()["outputs"]}
    assert answer.json()["id"] == "r1"
    assert outputs["LABEL"]["data"] == labels
    assert outputs["SCORE"]["data"] == pytest.approx(expected, abs=1e-7)
    assert outputs["SCORE"]["datatype"] == "FP32" and outputs["SCORE"]["shape"] == [len(TEXTS)]


def test_the_hugging_face_shape_is_taken_too(srv: RunningServer) -> None:
    one = requests.post(url(srv, "/v1/classify"), json={"inputs": TEXTS[0]}, timeout=10).json()
    listed = requests.post(
        url(srv, "/v1/classify"), json={"inputs": TEXTS, "parameters": {"top_k": 1}}, timeout=10
    ).json()
    assert one["results"][0] == {**listed["results"][0], "top": []}
    assert len(listed["results"][0]["top"]) == 1


def test_the_binary_tensor_extension(srv: RunningServer) -> None:
    """Triton's binary extension by hand: inputs framed after the JSON header, outputs asked
    binary come after the answer's JSON, Inference-Header-Content-Length on both."""
    raw = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in TEXTS)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "TEXT",
                    "shape": [len(TEXTS), 1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "SCORE", "parameters": {"binary_data": True}}, {"name": "LABEL"}],
        }
    ).encode()
    answer = requests.post(
        url(srv, f"/v2/models/{MODEL}/versions/1/infer"),
        data=header + raw,
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    length = int(answer.headers["inference-header-content-length"])
    document = json.loads(answer.content[:length])
    score, label = document["outputs"]
    assert score["parameters"]["binary_data_size"] == 4 * len(TEXTS)
    assert label["shape"] == [len(TEXTS), 1] and len(label["data"]) == len(TEXTS)
    scores = struct.unpack(f"<{len(TEXTS)}f", answer.content[length:])
    with Client(srv.address) as client:
        expected = [p.score for p in client.classify(TEXTS).predictions]
    assert list(scores) == pytest.approx(expected, abs=1e-7)


def test_curl_in_the_docs_works(srv: RunningServer) -> None:
    if shutil.which("curl") is None:
        pytest.skip("no curl on this machine")
    done = subprocess.run(
        ["curl", "-sS", "--fail-with-body", url(srv, "/v1/classify"),
         "-H", "Content-Type: application/json", "-d", '{"texts": ["a good film"]}'],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    assert json.loads(done.stdout)["results"][0]["label"] in ("positive", "negative")


# -- errors ---------------------------------------------------------------------------------------

TAXONOMY = [
    (ValidationError("bad input"), 400, "INVALID_ARGUMENT"),
    (ModelNotFoundError("no such model"), 404, "NOT_FOUND"),
    (NotReadyError("warming up"), 503, "UNAVAILABLE"),
    (OverloadedError("queue full"), 429, "RESOURCE_EXHAUSTED"),
    (DeadlineExceededError("too late"), 504, "DEADLINE_EXCEEDED"),
    (CancelledError("gone"), 499, "CANCELLED"),
    (LoadFailedError("refused"), 409, "FAILED_PRECONDITION"),
    (InternalError("broken"), 500, "INTERNAL"),
    (ServiceError("other"), 500, "INTERNAL"),
    (RuntimeError("secret internals"), 500, "INTERNAL"),
]


@pytest.mark.parametrize(("exc", "status", "code"), TAXONOMY, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("path", ["/v1/classify", f"/v2/models/{MODEL}/infer"])
def test_every_error_class_answers_its_status_with_a_json_message(
    srv: RunningServer, monkeypatch: pytest.MonkeyPatch, exc: Exception, status: int, code: str,
    path: str,
) -> None:  # fmt: skip
    handle = srv.server.repository.get()

    async def failing(*args: Any, **kwargs: Any) -> Any:
        raise exc

    monkeypatch.setattr(handle, "classify", failing)
    if path == "/v1/classify":
        body: dict[str, Any] = {"texts": ["a good film"]}
    else:
        body = {"inputs": [{"name": "TEXT", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}
    response = requests.post(url(srv, path), json=body, timeout=10)
    assert response.status_code == status
    answer = response.json()
    assert answer["code"] == code
    if isinstance(exc, ServiceError):
        assert str(exc) in answer["error"]
    else:
        assert answer["error"] == "internal error (logged on the server)"


def test_real_failures_answer_their_status(srv: RunningServer) -> None:
    post = lambda path, body: requests.post(url(srv, path), json=body, timeout=10)  # noqa: E731
    assert post("/v1/classify", {"texts": [""]}).status_code == 400
    assert post("/v1/classify", {"texts": "not a list"}).status_code == 400
    assert post("/v1/classify", {"texts": ["x"], "version": -1}).status_code == 400
    assert post("/v1/classify", {"texts": ["x"], "model": "nope"}).status_code == 404
    assert post("/v1/classify", {"texts": ["x"], "version": 7}).status_code == 404
    assert post(f"/v2/models/{MODEL}/versions/01/infer", {}).status_code == 404
    bad_tensor = {"inputs": [{"name": "TEXT", "shape": [2], "datatype": "BYTES", "data": ["x"]}]}
    answer = post(f"/v2/models/{MODEL}/infer", bad_tensor)
    assert answer.status_code == 400 and "TEXT" in answer.json()["error"]
    garbage = requests.post(url(srv, "/v1/classify"), data=b"{not json", timeout=10)
    assert garbage.status_code == 400 and "JSON" in garbage.json()["error"]
    assert requests.get(url(srv, "/v1/classify"), timeout=10).status_code == 405


def test_queue_full_is_429_and_request_timeout_is_504(srv: RunningServer) -> None:
    handle = srv.server.repository.get()
    srv.call(handle.batcher.pause)
    try:
        results: list[int] = []
        held = [
            threading.Thread(
                target=lambda: results.append(
                    requests.post(
                        url(srv, "/v1/classify"),
                        json={"texts": ["a good film"] * 4},
                        headers={"Request-Timeout": "1.5"},
                        timeout=30,
                    ).status_code
                )
            )
        ]
        held[0].start()
        deadline = time.monotonic() + 10
        while handle.stats().queue_depth < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        full = requests.post(url(srv, "/v1/classify"), json={"texts": ["x"]}, timeout=10)
        assert full.status_code == 429 and full.json()["code"] == "RESOURCE_EXHAUSTED"
        held[0].join(timeout=30)
        assert results == [504]  # expired in the paused queue: the deadline header's doing
    finally:
        srv.call(handle.batcher.resume)
    bad = requests.post(
        url(srv, "/v1/classify"), json={"texts": ["x"]}, headers={"Request-Timeout": "soon"},
        timeout=10,
    )  # fmt: skip
    assert bad.status_code == 400


def test_a_body_over_the_limit_is_refused_before_it_is_read(repository: Path) -> None:
    with running_server(repository, metrics_port=0, max_message_bytes=4096) as srv:
        port = srv.server.metrics_port or 0
        # Declared too large: 413 on the headers alone, though no byte of the body is sent.
        started = time.monotonic()
        answer = raw_exchange(
            port,
            b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n",
        )
        assert answer.startswith(b"HTTP/1.1 413") and time.monotonic() - started < 5
        assert b'"code": "RESOURCE_EXHAUSTED"' in answer
        # Chunked with no length: refused once past the limit, the rest never read.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            chunk = b"x" * 8192
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            reply = sock.recv(65536)
            assert reply.startswith(b"HTTP/1.1 413")


def test_a_gzip_body_is_read_and_bounded_after_inflating(repository: Path) -> None:
    with running_server(repository, metrics_port=0, max_message_bytes=4096) as srv:
        endpoint = url(srv, "/v1/classify")
        plain = requests.post(endpoint, json={"texts": TEXTS}, timeout=10)
        body = json.dumps({"texts": TEXTS}).encode()
        for coding, data in [("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))]:
            zipped = requests.post(
                endpoint, data=data, headers={"Content-Encoding": coding}, timeout=10
            )
            assert zipped.status_code == 200, (coding, zipped.text)
            assert zipped.json()["results"] == plain.json()["results"]
        # 4 KiB on the wire, 1 MiB inflated: refused at the limit, never inflated whole
        bomb = gzip.compress(json.dumps({"texts": ["a" * (1 << 20)]}).encode())
        assert len(bomb) < 4096
        refused = requests.post(endpoint, data=bomb, headers={"Content-Encoding": "gzip"})
        assert refused.status_code == 413 and refused.json()["code"] == "RESOURCE_EXHAUSTED"
        for headers, data, status in [
            ({"Content-Encoding": "br"}, body, 415),
            ({"Content-Encoding": "gzip"}, body, 400),  # not gzip at all
            ({"Content-Encoding": "gzip"}, gzip.compress(body)[:-12], 400),  # truncated
        ]:
            answer = requests.post(endpoint, data=data, headers=headers, timeout=10)
            assert answer.status_code == status, (headers, answer.text)
            assert answer.json()["code"] == "INVALID_ARGUMENT"


# -- authentication -------------------------------------------------------------------------------


def test_tokens_guard_every_route_but_the_probes(repository: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN}\n")
    with running_server(
        repository, metrics_port=0, security=SecurityConfig(auth_token_file=tokens)
    ) as srv:
        for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"):
            assert requests.get(url(srv, path), timeout=10).status_code == 200, path
        guarded = [
            ("GET", "/metrics"), ("GET", "/v2"), ("GET", f"/v2/models/{MODEL}"),
            ("GET", f"/v2/models/{MODEL}/ready"), ("GET", f"/v2/models/{MODEL}/config"),
            ("GET", "/v2/models/stats"), ("POST", f"/v2/models/{MODEL}/infer"),
            ("POST", "/v1/classify"), ("GET", "/openapi.json"),
        ]  # fmt: skip
        body = {"texts": ["a good film"]}
        for method, path in guarded:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                response = requests.request(
                    method, url(srv, path), json=body, headers=headers, timeout=10
                )
                assert response.status_code == 401, (method, path, headers)
                assert response.json()["code"] == "UNAUTHENTICATED"
        ok = requests.post(
            url(srv, "/v1/classify"),
            json=body,
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert ok.status_code == 200
        metrics = requests.get(
            url(srv, "/metrics"), headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        )
        assert metrics.status_code == 200


def test_openapi_describes_every_route_and_is_valid(srv: RunningServer) -> None:
    from openapi_spec_validator import validate

    document = requests.get(url(srv, "/openapi.json"), timeout=10).json()
    validate(document)  # the real validator: raises on an invalid document
    assert {"/v1/classify", "/readyz", "/v2/models/{model}/versions/{version}/infer"} <= set(
        document["paths"]
    )
    assert document["paths"]["/readyz"]["get"]["security"] == []  # the probes are open


def test_http_port_off_keeps_only_the_probes_and_metrics(repository: Path) -> None:
    from textserve.service.config import HttpConfig

    with running_server(repository, metrics_port=0, http=HttpConfig(inference=False)) as srv:
        assert requests.get(url(srv, "/readyz"), timeout=10).status_code == 200
        assert requests.get(url(srv, "/metrics"), timeout=10).status_code == 200
        for path in ("/v1/classify", f"/v2/models/{MODEL}/infer"):
            response = requests.post(url(srv, path), json={"texts": ["x"]}, timeout=10)
            assert response.status_code == 404 and "off" in response.json()["error"], path


def test_a_client_gone_mid_body_is_no_error(
    srv: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    port = srv.server.metrics_port or 0
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b'POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"te')
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the server notices the close on its own loop
        assert requests.get(url(srv, "/healthz"), timeout=10).status_code == 200
        time.sleep(0.05)
        if srv.server.http is not None and srv.server.http.app.inflight == 0:
            break
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


def test_the_classify_command_speaks_http_too(srv: RunningServer) -> None:
    import sys

    def classify(server: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "textserve.cli", "classify", "--server", server, "--json",
             "--top-k", "2", *extra, *TEXTS],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    over_http = classify(url(srv, ""))
    over_grpc = classify(srv.address)
    assert over_http.returncode == 0, over_http.stderr
    assert json.loads(over_http.stdout) == json.loads(over_grpc.stdout)
    unknown = classify(url(srv, ""), "--model", "nope")
    assert unknown.returncode != 0 and "nope" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1  # one line, no traceback
