"""--max-queue-wait-ms: a request that would wait longer than the bound behind the queued work
is refused at once with a retryable status (gRPC RESOURCE_EXHAUSTED, HTTP 429), a deadline
nearer than the wait is refused up front (DEADLINE_EXCEEDED), each counted by reason; with the
bound off the same queue takes the request."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
import requests

from tests.serving import RunningServer, poll, running_server
from textserve.service.config import BatcherConfig
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

TEXT = "a good film with a bad plot and a great cast"


def refusals(srv: RunningServer, model: str, reason: str) -> float:
    labels = {"model": model, "reason": reason}
    return srv.metrics.registry.get_sample_value("textserve_admission_refusals_total", labels) or 0


def _held_queue(srv: RunningServer, stub: pb_grpc.ClassifierStub, texts: int) -> list[object]:
    """Measure the drain rate with one request, then pause the batcher and queue `texts` in
    one request (admitted: nothing is queued ahead of it)."""
    stub.Classify(pb.ClassifyRequest(texts=[TEXT] * 8), timeout=60)
    handle = srv.server.repository.get()
    assert handle.batcher.expected_wait() == 0.0  # nothing queued
    srv.call(handle.batcher.pause)
    held = [stub.Classify.future(pb.ClassifyRequest(texts=[TEXT] * texts), timeout=120)]
    poll(lambda: handle.stats().queue_depth == texts, "the queue to fill")
    return held


@pytest.mark.parametrize("bound_ms", [None, 1.0])
def test_a_long_wait_is_refused_at_once_with_a_retryable_status(
    tiny_repository: Path, bound_ms: float | None
) -> None:
    config = BatcherConfig(max_queue_wait=None if bound_ms is None else bound_ms / 1000)
    with running_server(tiny_repository, batcher=config, metrics_port=0) as srv:
        handle = srv.server.repository.get()
        with srv.channel() as channel:
            stub = pb_grpc.ClassifierStub(channel)
            held = _held_queue(srv, stub, 256)
            try:
                waiting = handle.batcher.expected_wait()
                assert waiting > 0.001  # 256 queued texts: more than a millisecond of work
                started = time.monotonic()
                late = stub.Classify.future(pb.ClassifyRequest(texts=[TEXT]), timeout=60)
                http = None
                if bound_ms is not None:
                    with pytest.raises(grpc.RpcError) as caught:
                        late.result()
                    assert time.monotonic() - started < 5  # at once, not after the queue
                    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert "ms of work (limit 1 ms)" in (caught.value.details() or "")
                    url = f"http://127.0.0.1:{srv.server.metrics_port}/v1/classify"
                    http = requests.post(url, json={"texts": [TEXT]}, timeout=60)
                    assert http.status_code == 429 and http.json()["code"] == "RESOURCE_EXHAUSTED"
                    assert refusals(srv, handle.name, "queue_wait") == 2
            finally:
                srv.call(handle.batcher.resume)
            for future in held:
                assert len(future.result().results) == 256  # the accepted one is answered
            if bound_ms is None:
                assert len(late.result().results) == 1  # off: queued behind them and answered
                assert refusals(srv, handle.name, "queue_wait") == 0


def test_a_deadline_nearer_than_the_wait_is_refused_up_front(tiny_repository: Path) -> None:
    config = BatcherConfig(max_queue_wait=600.0, max_queue_size=8192)
    with running_server(tiny_repository, batcher=config, max_texts_per_request=4096) as srv:
        handle = srv.server.repository.get()
        with srv.channel() as channel:
            stub = pb_grpc.ClassifierStub(channel)
            held = _held_queue(srv, stub, 4096)
            try:
                wait = handle.batcher.expected_wait()
                assert wait > 0.02  # 4096 queued texts: tens of ms of work even on a fast CPU
                # half the wait left when the server sees it (its deadline is 50 ms early)
                timeout = wait / 2 + 0.05
                with pytest.raises(grpc.RpcError) as caught:
                    stub.Classify(pb.ClassifyRequest(texts=[TEXT]), timeout=timeout)
                assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
                assert "left before the deadline" in (caught.value.details() or "")
                assert handle.stats().rejected_deadline == 1
                assert refusals(srv, handle.name, "deadline") == 1
            finally:
                srv.call(handle.batcher.resume)
            for future in held:
                future.result()


def test_the_client_library_retries_a_refusal_until_the_server_admits_it(
    tiny_repository: Path,
) -> None:
    import threading

    from textserve.client import Client

    config = BatcherConfig(max_queue_wait=0.001)
    with running_server(tiny_repository, batcher=config) as srv:
        handle = srv.server.repository.get()
        answers: list[object] = []
        with srv.channel() as channel, Client(srv.address) as client:
            held = _held_queue(srv, pb_grpc.ClassifierStub(channel), 256)
            caller = threading.Thread(target=lambda: answers.append(client.classify([TEXT])))
            caller.start()
            poll(lambda: refusals(srv, handle.name, "queue_wait") >= 1, "a first refusal")
            srv.call(handle.batcher.resume)  # the queue drains: a retry is admitted
            caller.join(timeout=60)
            assert len(held[0].result().results) == 256  # type: ignore[attr-defined]
        assert len(answers) == 1  # answered, not raised: the refusal was retried


def test_calls_beyond_the_concurrent_limit_are_refused_at_once_never_cancelled(
    tiny_repository: Path,
) -> None:
    with running_server(tiny_repository, max_concurrent_rpcs=2) as srv:
        handle = srv.server.repository.get()
        with srv.channel() as channel:
            stub = pb_grpc.ClassifierStub(channel)
            srv.call(handle.batcher.pause)
            try:
                held = [
                    stub.Classify.future(pb.ClassifyRequest(texts=[TEXT]), timeout=60)
                    for _ in range(2)
                ]
                poll(lambda: handle.stats().queue_depth == 2, "two calls in flight")
                started = time.monotonic()
                with pytest.raises(grpc.RpcError) as caught:
                    stub.Classify(pb.ClassifyRequest(texts=[TEXT]), timeout=60)
                assert time.monotonic() - started < 5  # at the door, not after the queue
                assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                assert caught.value.details() == "Concurrent RPC limit exceeded!"  # grpc.aio's
                # counted, though no handler of ours saw it (channelz, by the backlog's sampler)
                poll(lambda: unhandled(srv) == 1, "the refusal counted")
            finally:
                srv.call(handle.batcher.resume)
            assert all(len(future.result().results) == 1 for future in held)
            # the slots are free again
            assert len(stub.Classify(pb.ClassifyRequest(texts=[TEXT]), timeout=60).results) == 1
            time.sleep(0.2)  # a few samples more: the calls served are not counted
            assert unhandled(srv) == 1


def unhandled(srv: RunningServer) -> float | None:
    return srv.metrics.registry.get_sample_value("textserve_grpc_calls_unhandled_total")
