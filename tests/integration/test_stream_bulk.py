"""ClassifyStream as the bulk path (issue 15): many requests in flight on one stream, each
answered as its batch finishes; `Client.classify_stream` and `textserve classify --stream`
give every text's answer in input order, the same as unary Classify; a request that fails
comes back as an error response with its id while the others are answered; the stream bench
mode runs against a real server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.serving import RunningServer, running_server
from textserve.cli import main as cli_main
from textserve.client import Client, ClientError
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

TIMEOUT = 120  # generous: a busy 2-core machine

WORDS = [
    "a",
    "gripping",
    "beautifully",
    "acted",
    "film",
    "dull",
    "plot",
    "terrible",
    "boring",
    "wonderful",
    "cast",
]


def many_texts(n: int) -> list[str]:
    """Distinct texts of varied lengths (so batches mix lengths and answers come out of order)."""
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(1 + i % 23)) for i in range(n)]


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> Iterator[RunningServer]:
    with running_server(tiny_repository, stream_max_inflight=16) as running:
        yield running


def unary_answers(address: str, texts: list[str]) -> list[tuple[str, float]]:
    with Client(address, timeout=TIMEOUT) as client:
        result = client.classify(texts)
    return [(p.label, p.score) for p in result.predictions]


def test_one_stream_answers_many_requests_in_flight_each_with_its_id_and_error(
    server: RunningServer,
) -> None:
    texts = many_texts(150)
    requests = [pb.ClassifyRequest(id=f"t{i}", texts=[t]) for i, t in enumerate(texts)]
    # errors among them: an empty text, an unknown model, a text too long without truncation
    requests.insert(40, pb.ClassifyRequest(id="empty", texts=[" "]))
    requests.insert(80, pb.ClassifyRequest(id="nomodel", texts=["good"], model="nope"))
    requests.insert(120, pb.ClassifyRequest(id="long", texts=["film " * 5000], truncate=False))
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.ClassifierStub(channel)
        responses = list(stub.ClassifyStream(iter(requests), timeout=TIMEOUT))
    by_id = {r.id: r for r in responses}
    assert len(responses) == len(requests) == len(by_id)
    code = {name: getattr(grpc.StatusCode, name).value[0] for name in ("INVALID_ARGUMENT",
                                                                       "NOT_FOUND")}  # fmt: skip
    assert by_id["empty"].error.code == code["INVALID_ARGUMENT"]
    assert "texts[0] is empty" in by_id["empty"].error.message
    assert by_id["nomodel"].error.code == code["NOT_FOUND"]
    assert by_id["long"].error.code == code["INVALID_ARGUMENT"]
    assert not any(by_id[k].results for k in ("empty", "nomodel", "long"))
    expected = unary_answers(server.address, texts)
    for i, (label, score) in enumerate(expected):
        (result,) = by_id[f"t{i}"].results
        assert not by_id[f"t{i}"].HasField("error")
        assert result.label == label and result.score == pytest.approx(score, abs=1e-5)


def test_a_stream_error_response_is_counted_once_in_the_metrics(server: RunningServer) -> None:
    def count(code: str) -> float:
        value = server.metrics.registry.get_sample_value(
            "textserve_request_duration_seconds_count",
            {"method": "ClassifyStream", "model": "tiny", "code": code},
        )
        return value or 0.0

    ok, bad = count("OK"), count("INVALID_ARGUMENT")
    requests = [pb.ClassifyRequest(id="a", texts=["good"]), pb.ClassifyRequest(id="b", texts=[""])]
    with grpc.insecure_channel(server.address) as channel:
        list(pb_grpc.ClassifierStub(channel).ClassifyStream(iter(requests), timeout=TIMEOUT))
    assert count("OK") == ok + 1 and count("INVALID_ARGUMENT") == bad + 1


@pytest.mark.parametrize(("per_message", "connections"), [(1, 1), (3, 2)])
def test_client_classify_stream_yields_every_answer_in_input_order(
    server: RunningServer, per_message: int, connections: int
) -> None:
    texts = many_texts(203)
    with Client(server.address, connections=connections) as client:
        results = list(
            client.classify_stream(
                iter(texts), texts_per_message=per_message, max_inflight=40, timeout=TIMEOUT
            )
        )
    assert len(results) == -(-len(texts) // per_message)
    got = [(p.label, p.score) for r in results for p in r.predictions]
    expected = unary_answers(server.address, texts)
    assert [label for label, _ in got] == [label for label, _ in expected]
    assert [s for _, s in got] == pytest.approx([s for _, s in expected], abs=1e-5)
    assert {(r.model, r.version) for r in results} == {("tiny", 1)}


def test_client_classify_stream_raises_on_a_refused_message_and_can_stop_early(
    server: RunningServer,
) -> None:
    with Client(server.address) as client:
        with pytest.raises(ClientError) as caught:
            list(client.classify_stream(["good", "fine", "", "bad"], timeout=TIMEOUT))
        assert caught.value.code == "INVALID_ARGUMENT" and "texts 2..:" in caught.value.message
        # an endless input, left after a few answers: the streams end, nothing hangs
        endless = (f"text number {i}" for i in range(10**9))
        stream = client.classify_stream(endless, max_inflight=8, timeout=TIMEOUT)
        first = [next(stream) for _ in range(5)]
        stream.close()
        assert len(first) == 5
        # the client is still usable
        assert client.classify(["good"]).predictions[0].label


def test_classify_file_over_a_stream_matches_unary(
    server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = many_texts(120)
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(texts[:60]) + "\n\n" + "\n".join(texts[60:]) + "\n")
    base = ["classify", "--server", server.address, "--file", str(path), "--json"]
    assert cli_main([*base, "--stream", "--connections", "2"]) == 0
    streamed = json.loads(capsys.readouterr().out)
    assert cli_main(base) == 0
    unary = json.loads(capsys.readouterr().out)
    assert [r["text"] for r in streamed["results"]] == texts
    assert [r["label"] for r in streamed["results"]] == [r["label"] for r in unary["results"]]
    assert [r["score"] for r in streamed["results"]] == pytest.approx(
        [r["score"] for r in unary["results"]], abs=1e-5
    )
    assert (streamed["model"], streamed["version"]) == ("tiny", 1)


def test_classify_stream_cli_reports_a_refused_text(
    server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "texts.txt"
    path.write_text("good\n" + "film " * 5000 + "\n")
    args = ["classify", "--server", server.address, "--file", str(path), "--stream"]
    assert cli_main([*args, "--no-truncate"]) == 2
    assert "INVALID_ARGUMENT: texts 1..:" in capsys.readouterr().err


def test_progress_line_counts_texts() -> None:
    import io

    from textserve.commands.classify import Progress

    out = io.StringIO()
    progress = Progress(10, out, every=0.0)
    for _ in range(10):
        progress.update(1)
    progress.close()
    assert out.getvalue().rstrip().rsplit("\r", 1)[-1].startswith("10/10 texts (100%)")


def test_stream_loop_against_the_server_counts_answers_and_errors(
    server: RunningServer, tiny_run: Path
) -> None:
    from textserve.bench.loadgen import stream_loop
    from textserve.bench.requests import build_requests, load_texts

    pool = build_requests(load_texts(tiny_run), "stream", 1, "tiny", count=64)
    raw, _ = asyncio.run(stream_loop(server.address, pool, 2, 8, warmup=0.1, duration=0.5))
    assert raw.requests_done > 0 and raw.texts == raw.requests_done and not raw.errors
    bad = build_requests(["x"], "stream", 1, "nope", count=16)
    raw, _ = asyncio.run(stream_loop(server.address, bad, 1, 4, warmup=0.0, duration=0.3))
    assert raw.requests_done == 0 and raw.errors["NOT_FOUND"] > 0
