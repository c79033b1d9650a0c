"""textserve.v1 against a real server (create_server on 127.0.0.1:0) serving the real exported
tiny model: parity with in-process onnxruntime, batching, every error case, streaming, the CLI."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import onnxruntime
import pytest
from tokenizers import Tokenizer

from tests.serving import RunningServer, running_server
from textserve.artifact import Manifest, newest_version
from textserve.cli import main as cli_main
from textserve.service.config import BatcherConfig, RuntimeConfig
from textserve.service.engine.handle import ModelHandle
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

MAX_TEXTS = 16
WORDS = [
    "a",
    "gripping",
    "beautifully",
    "acted",
    "film",
    "with",
    "a",
    "dull",
    "plot",
    "and",
    "wooden",
    "dialogue",
]


@pytest.fixture(scope="module")
def version_dir(tiny_repository: Path) -> Path:
    (name,) = [p for p in tiny_repository.iterdir() if p.is_dir()]
    newest = newest_version(name)
    assert newest is not None
    return newest[1]


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> Iterator[RunningServer]:
    with running_server(tiny_repository, max_texts_per_request=MAX_TEXTS) as srv:
        yield srv


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Iterator[pb_grpc.ClassifierStub]:
    with server.channel() as channel:
        yield pb_grpc.ClassifierStub(channel)


def handle_of(server: RunningServer) -> ModelHandle:
    return server.server.repository.get()


def wait_for_queue(stub: pb_grpc.ClassifierStub, depth: int) -> None:
    """Poll GetModel until `depth` texts wait in the queue."""
    for _ in range(3000):
        if stub.GetModel(pb.GetModelRequest()).batching.queue_depth == depth:
            return
        time.sleep(0.01)
    raise AssertionError(f"queue never reached {depth}")


def reference_probabilities(version_dir: Path, texts: list[str]) -> np.ndarray:
    """Each text alone through a plain onnxruntime session, tokenized by the contract."""
    manifest = Manifest.read(version_dir)
    tokenizer = Tokenizer.from_file(str(version_dir / "tokenizer.json"))
    session = onnxruntime.InferenceSession(
        str(version_dir / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    unk = tokenizer.token_to_id("[UNK]")
    rows = []
    for text in texts:
        ids = tokenizer.encode(text).ids[: manifest.max_length] or [unk]
        input_ids = np.array([ids], dtype=np.int64)
        (logits,) = session.run(
            ["logits"], {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids)}
        )
        exp = np.exp(logits[0] - logits[0].max())
        rows.append(exp / exp.sum())
    return np.array(rows, dtype=np.float32)


def texts_of_many_lengths(n: int) -> list[str]:
    rng = np.random.default_rng(7)
    lengths = [1, 2, 3, 200, 5, 40, 8, 63, 64, 65, 13, 100][:n]
    return [" ".join(rng.choice(WORDS, size=k)) for k in lengths]


def scores(response: pb.ClassifyResponse) -> np.ndarray:
    return np.array([list(r.scores) for r in response.results], dtype=np.float32)


def test_probabilities_equal_in_process_onnxruntime_alone_and_batched(
    server: RunningServer, stub: pb_grpc.ClassifierStub, version_dir: Path
) -> None:
    texts = texts_of_many_lengths(12)
    expected = reference_probabilities(version_dir, texts)
    alone = np.concatenate(
        [scores(stub.Classify(pb.ClassifyRequest(texts=[t], all_scores=True))) for t in texts]
    )
    np.testing.assert_allclose(alone, expected, atol=1e-5, rtol=0)

    # all in one request, and as concurrent requests held until they share one batch
    together = scores(stub.Classify(pb.ClassifyRequest(texts=texts, all_scores=True)))
    np.testing.assert_allclose(together, expected, atol=1e-5, rtol=0)
    handle = handle_of(server)
    before = handle.stats().batches
    server.call(handle.batcher.pause)
    try:
        futures = [
            stub.Classify.future(pb.ClassifyRequest(texts=[t], all_scores=True), timeout=60)
            for t in texts
        ]
        wait_for_queue(stub, len(texts))
    finally:
        server.call(handle.batcher.resume)
    mixed = np.concatenate([scores(f.result()) for f in futures])
    np.testing.assert_allclose(mixed, expected, atol=1e-5, rtol=0)
    assert handle.stats().batches - before < len(texts)  # they really were batched together
    labels = list(handle.labels)
    best = [labels[i] for i in expected.argmax(axis=1)]
    assert [r.label for f in futures for r in f.result().results] == best


def in_threads(caller: Callable[[int], None], n: int) -> None:
    """caller(0) … caller(n - 1), each in its own thread at once; re-raises the first failure."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            caller(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_batches_form_under_64_concurrent_callers(
    tiny_repository: Path,
) -> None:
    # a longer delay than the default so that batching shows on any machine's timing
    config = BatcherConfig(max_queue_delay=0.05)
    with running_server(tiny_repository, batcher=config) as srv, srv.channel() as channel:
        stub = pb_grpc.ClassifierStub(channel)

        def caller(i: int) -> None:
            for j in range(3):
                stub.Classify(pb.ClassifyRequest(texts=[f"{WORDS[i % 12]} film {j}"]))

        in_threads(caller, 64)
        batching = stub.GetModel(pb.GetModelRequest()).batching
    assert batching.items == 64 * 3
    assert batching.max_batch_size_seen > 1 and batching.mean_batch_size > 1
    name = srv.server.repository.default_model
    count = srv.metrics.registry.get_sample_value("textserve_batch_size_count", {"model": name})
    total = srv.metrics.registry.get_sample_value("textserve_batch_size_sum", {"model": name})
    assert total == 64 * 3 and count < total


def test_two_inference_threads_give_every_caller_its_own_probabilities(
    tiny_repository: Path, version_dir: Path
) -> None:
    # --inference-threads 2: two executor threads take batches from one queue (each goes on to
    # the next due batch by itself); 48 concurrent callers, each text once, all answers right.
    texts = [f"{WORDS[i % 12]} {WORDS[(i * 5) % 12]} film number {i}" for i in range(48)]
    expected = reference_probabilities(version_dir, texts)
    runtime = RuntimeConfig(intra_op_threads=1, inference_threads=2)
    with running_server(tiny_repository, runtime=runtime) as srv, srv.channel() as channel:
        stub = pb_grpc.ClassifierStub(channel)
        got: dict[int, np.ndarray] = {}

        def caller(i: int) -> None:
            request = pb.ClassifyRequest(texts=[texts[i]], all_scores=True)
            got[i] = scores(stub.Classify(request, timeout=60))[0]

        in_threads(caller, len(texts))
        batching = stub.GetModel(pb.GetModelRequest()).batching
    np.testing.assert_allclose(np.stack([got[i] for i in range(len(texts))]), expected, atol=1e-5)
    assert batching.items == len(texts) and batching.queue_depth == 0


def expect_error(
    stub: pb_grpc.ClassifierStub, request: pb.ClassifyRequest, code: grpc.StatusCode
) -> str:
    with pytest.raises(grpc.RpcError) as info:
        stub.Classify(request, timeout=30)
    assert info.value.code() == code, info.value.details()
    return str(info.value.details())


def test_invalid_arguments_name_what_is_wrong(stub: pb_grpc.ClassifierStub) -> None:
    code = grpc.StatusCode.INVALID_ARGUMENT
    assert "no texts" in expect_error(stub, pb.ClassifyRequest(), code)
    message = expect_error(stub, pb.ClassifyRequest(texts=["x"] * (MAX_TEXTS + 1)), code)
    assert f"{MAX_TEXTS + 1} texts in one request; the limit is {MAX_TEXTS}" in message
    message = expect_error(stub, pb.ClassifyRequest(texts=["good", "fine", ""]), code)
    assert "texts[2] is empty" in message
    long_text = " ".join(["film"] * 300)  # under the character cap: tokenized, then refused
    message = expect_error(stub, pb.ClassifyRequest(texts=["ok", long_text], truncate=False), code)
    assert "texts[1] is 300 tokens long" in message and "at most 64" in message
    # the same text is cut, not refused, by default
    result = stub.Classify(pb.ClassifyRequest(texts=[long_text])).results[0]
    assert result.truncated and result.num_tokens == 64


def test_unknown_model_or_version_lists_what_exists(stub: pb_grpc.ClassifierStub) -> None:
    info = stub.GetModel(pb.GetModelRequest())
    message = expect_error(
        stub, pb.ClassifyRequest(texts=["x"], model="nope"), grpc.StatusCode.NOT_FOUND
    )
    assert "model 'nope' not found" in message and info.name in message
    message = expect_error(
        stub, pb.ClassifyRequest(texts=["x"], version=999), grpc.StatusCode.NOT_FOUND
    )
    assert "no version 999" in message and f"{info.version} (ready)" in message


def test_full_queue_is_refused_at_once(tiny_repository: Path) -> None:
    """Refused at once: a refusal takes no longer than a normal request (that runs the model),
    both timed here, against the same server, the median of several of each."""

    def timed(call: Callable[[], object]) -> float:
        started = time.perf_counter()
        call()
        return time.perf_counter() - started

    with running_server(tiny_repository, batcher=BatcherConfig(max_queue_size=4)) as srv:
        handle = handle_of(srv)
        with srv.channel() as channel:
            stub = pb_grpc.ClassifierStub(channel)
            request = pb.ClassifyRequest(texts=["d", "e"])
            stub.Classify(request, timeout=30)  # warm the channel and the worker
            normal = sorted(timed(lambda: stub.Classify(request, timeout=30)) for _ in range(7))
            srv.call(handle.batcher.pause)
            try:
                held = stub.Classify.future(pb.ClassifyRequest(texts=["a", "b", "c"]), timeout=60)
                wait_for_queue(stub, 3)
                code = grpc.StatusCode.RESOURCE_EXHAUSTED
                messages: list[str] = []
                refused = sorted(
                    timed(lambda: messages.append(expect_error(stub, request, code)))
                    for _ in range(7)
                )
                assert "3 texts queued (limit 4)" in messages[0]
            finally:
                srv.call(handle.batcher.resume)
            assert len(held.result().results) == 3
            # normal requests timed before and after: load that comes and goes hits both sides
            normal = sorted(
                normal + [timed(lambda: stub.Classify(request, timeout=30)) for _ in range(7)]
            )
    assert refused[3] < 4 * normal[7], (refused, normal)
    value = srv.metrics.registry.get_sample_value
    labels = {"method": "Classify", "model": handle.name, "reason": "resource_exhausted"}
    assert value("textserve_request_failures_total", labels) == 7


def test_deadline_expiring_in_the_queue_never_reaches_the_model(
    server: RunningServer, stub: pb_grpc.ClassifierStub
) -> None:
    """The caller's deadline goes to the queue: the server itself answers DEADLINE_EXCEEDED and
    drops the items as expired. A server that ignored deadlines would still see grpc cancel the
    call at the deadline, so cancellations must not count here: only the deadline's own trail
    (its message, dropped_deadline, the `deadline_exceeded` failure reason)."""
    handle = handle_of(server)
    value = server.metrics.registry.get_sample_value
    failures = {"method": "Classify", "model": handle.name, "reason": "deadline_exceeded"}
    failed_before = value("textserve_request_failures_total", failures)
    before = handle.stats()
    server.call(handle.batcher.pause)
    try:
        doomed = stub.Classify.future(pb.ClassifyRequest(texts=["late", "later"]), timeout=1.0)
        wait_for_queue(stub, 2)
        with pytest.raises(grpc.RpcError) as info:
            doomed.result()
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # Usually the server's own answer ("... s waiting for model 'tiny:1'"), sent
        # DEADLINE_MARGIN_S early; on a loaded machine the client's own deadline can still fire
        # first ("Deadline Exceeded"). The server-side trail below is what proves the deadline
        # reached the queue, whichever message the client saw.
        assert info.value.details() in ("Deadline Exceeded",) or "s waiting for model 'tiny:" in (
            info.value.details() or ""
        )
    finally:
        server.call(handle.batcher.resume)
    for _ in range(3000):  # the worker drops the dead items once it runs again
        if stub.GetModel(pb.GetModelRequest()).batching.queue_depth == 0:
            break
        time.sleep(0.01)
    after = handle.stats()
    assert after.items == before.items  # nothing of it reached the model
    assert after.dropped_deadline - before.dropped_deadline == 2
    assert after.dropped_cancelled == before.dropped_cancelled
    assert value("textserve_request_failures_total", failures) == failed_before + 1


def test_unexpected_error_is_internal_logged_and_the_server_goes_on(
    server: RunningServer, stub: pb_grpc.ClassifierStub, caplog: pytest.LogCaptureFixture
) -> None:
    handle = handle_of(server)
    original = handle.classify

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in the serving code")

    handle.classify = broken  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.ERROR):
            message = expect_error(stub, pb.ClassifyRequest(texts=["x"]), grpc.StatusCode.INTERNAL)
    finally:
        handle.classify = original  # type: ignore[method-assign]
    assert "a bug" not in message  # internals stay in the log
    assert "a bug in the serving code" in caplog.text and "Traceback" in caplog.text
    assert stub.Classify(pb.ClassifyRequest(texts=["still serving"])).results[0].label


def test_response_carries_id_version_top_k_and_timing(stub: pb_grpc.ClassifierStub) -> None:
    info = stub.GetModel(pb.GetModelRequest())
    response = stub.Classify(pb.ClassifyRequest(id="req-1", texts=["a film"], top_k=2))
    assert response.id == "req-1" and response.model == info.name
    assert response.model_version == info.version
    result = response.results[0]
    assert result.top[0].label == result.label
    assert result.top[0].score >= result.top[1].score and not result.scores
    assert response.timing.total_seconds >= response.timing.inference_seconds > 0


def test_list_and_get_model(stub: pb_grpc.ClassifierStub, version_dir: Path) -> None:
    manifest = Manifest.read(version_dir)
    listing = stub.ListModels(pb.ListModelsRequest())
    assert listing.default_model == manifest.name
    (summary,) = listing.models
    assert summary.ready_version == manifest.version and summary.is_default
    info = stub.GetModel(pb.GetModelRequest(name=manifest.name))
    assert list(info.labels) == manifest.labels and info.max_length == manifest.max_length
    assert info.execution_provider == "CPUExecutionProvider"
    assert info.state == pb.MODEL_STATE_READY and info.batching.max_batch_size == 64


def test_stream_answers_each_request_with_its_id(stub: pb_grpc.ClassifierStub) -> None:
    requests = [pb.ClassifyRequest(id=f"r{i}", texts=["good film"] * (i + 1)) for i in range(5)]
    requests.append(pb.ClassifyRequest(id="bad", texts=[""]))
    responses = {r.id: r for r in stub.ClassifyStream(iter(requests), timeout=60)}
    assert set(responses) == {"r0", "r1", "r2", "r3", "r4", "bad"}
    assert all(len(responses[f"r{i}"].results) == i + 1 for i in range(5))
    assert responses["bad"].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "texts[0] is empty" in responses["bad"].error.message


def test_classify_cli_prints_a_table_and_json(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "a gripping, beautifully acted film"
    assert cli_main(["classify", "--server", server.address, text]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["LABEL", "SCORE", "TEXT"] and out[1].endswith(text)
    labels = handle_of(server).labels
    assert out[1].split()[0] in labels
    assert cli_main(["classify", "--server", server.address, "--json", "--all-scores", text]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["results"]
    assert row["text"] == text and set(row["scores"]) == set(labels)
    assert abs(sum(row["scores"].values()) - 1) < 1e-5


def test_classify_cli_reports_server_errors(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["classify", "--server", server.address, "--model", "nope", "x"]) == 2
    assert "NOT_FOUND: model 'nope' not found" in capsys.readouterr().err
