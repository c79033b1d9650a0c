"""ClassifyStream under a greedy client (issue 20): a client that sends as fast as it can and
never reads its responses is slowed by HTTP/2 flow control, because the server stops reading
its requests once `--stream-max-inflight` of them are unanswered; the server's memory stays
bounded and it keeps answering everyone else. Also: the limit is honoured, a normal stream gets
every response, and a client cancelling its stream is no ERROR on the server."""

from __future__ import annotations

import logging
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.serving import RunningServer, running_server, serve_subprocess
from textserve.service.config import BatcherConfig
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

TIMEOUT = 120  # generous: a busy 2-core machine

MB = 1024 * 1024
FLOOD_SECONDS = 20
FLOOD_INFLIGHT = 32  # the default --stream-max-inflight, set explicitly so the bound below holds
# One flood message: 16 texts of ~200 characters, ~3.3 kB on the wire.
FLOOD_TEXTS = 16
FLOOD_REQUEST = pb.ClassifyRequest(
    id="flood", texts=[("a gripping, beautifully acted film " * 6)[:200]] * FLOOD_TEXTS
)
# What the server may hold for one such stream with the fix: FLOOD_INFLIGHT requests (parsed
# messages, ~10 kB of Python objects each with their texts) and as many responses (~1 kB), i.e.
# well under 1 MB; plus the request bytes grpc buffers in the server's flow-control windows
# (stream and connection, which grpc's BDP probing grows on loopback: ~5 MB measured), plus
# allocator noise. 40 MB is comfortably above all of that (+16 MB measured), and well under the
# growth without backpressure (every message read at once, one task each, every response kept
# until the client reads: +67 MB in 20 s measured here, +154 MB in the issue).
RSS_GROWTH_BOUND = 40 * MB
# The client can have sent at most what the server took (FLOOD_INFLIGHT requests plus those it
# answered into the client's 64 kB receive window) plus what fits in the windows between them
# (~5 MB measured). 16 MB of messages is well above that, and far below what an unthrottled
# client sends in 20 s (88,000 messages, 280 MB, measured without the fix).
WINDOW_MESSAGES = 16 * MB // FLOOD_REQUEST.ByteSize()
SENT_BOUND = FLOOD_INFLIGHT + WINDOW_MESSAGES
# The client keeps its receive window at grpc's initial 64 kB (no BDP probing), so the responses
# it never reads fill it and the server's writes block. With probing on, the client's grpc keeps
# enlarging its own window and buffers the unread responses in its own memory: the server still
# holds no more (same RSS), but the client is only slowed (~10x), not stopped.
CLIENT_OPTIONS = [("grpc.http2.bdp_probe", 0)]


class Flood:
    """A ClassifyStream client that sends FLOOD_REQUEST as fast as grpc lets it and never
    reads a response; `sent` counts the messages grpc took from it."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.sent = 0
        self.stop = threading.Event()
        stub = pb_grpc.ClassifierStub(channel)
        self.call = stub.ClassifyStream(self._requests(), timeout=FLOOD_SECONDS + TIMEOUT)

    def _requests(self) -> Iterator[pb.ClassifyRequest]:
        while not self.stop.is_set():
            yield FLOOD_REQUEST
            self.sent += 1


def stream_requests_answered(metrics_url: str | None) -> int:
    """ClassifyStream requests the server answered, from its /metrics."""
    assert metrics_url is not None
    with urllib.request.urlopen(metrics_url, timeout=TIMEOUT) as reply:
        text = reply.read().decode()
    found = re.findall(r'textserve_requests_total\{method="ClassifyStream"[^}]*\} (\S+)', text)
    return int(sum(float(value) for value in found))


class HealthPoller(threading.Thread):
    """Checks grpc.health.v1 on its own channel until stopped; records every failure."""

    def __init__(self, address: str) -> None:
        super().__init__(name="health-poller", daemon=True)
        self.address = address
        self.stop = threading.Event()
        self.answers = 0
        self.failures: list[str] = []

    def run(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while not self.stop.is_set():
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(), timeout=30).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        self.answers += 1
                    else:
                        self.failures.append(
                            health_pb2.HealthCheckResponse.ServingStatus.Name(status)
                        )
                except grpc.RpcError as exc:
                    self.failures.append(exc.code().name)
                self.stop.wait(0.2)


@pytest.mark.slow
def test_a_client_that_never_reads_is_slowed_and_memory_stays_bounded(
    tiny_repository: Path,
) -> None:
    with serve_subprocess(
        tiny_repository, "--stream-max-inflight", str(FLOOD_INFLIGHT), timeout=TIMEOUT
    ) as proc:
        server = psutil.Process(proc.process.pid)
        with grpc.insecure_channel(proc.address, options=CLIENT_OPTIONS) as channel:
            # One normal call first, so the baseline includes a warmed-up server and channel.
            stub = pb_grpc.ClassifierStub(channel)
            stub.Classify(FLOOD_REQUEST, timeout=TIMEOUT)
            before = server.memory_info().rss
            poller = HealthPoller(proc.address)
            poller.start()
            flood = Flood(channel)
            peak = before
            started = time.monotonic()
            try:
                while time.monotonic() - started < FLOOD_SECONDS:
                    peak = max(peak, server.memory_info().rss)
                    time.sleep(0.25)
                sent = flood.sent
                peak = max(peak, server.memory_info().rss)
                # Health still answers now, while the stream is stuck.
                health_now = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=TIMEOUT
                )
                # And a normal call on the same connection is still answered (not refused
                # as overloaded: the stream holds at most FLOOD_INFLIGHT requests' texts).
                try:
                    answer = stub.Classify(pb.ClassifyRequest(texts=["good"]), timeout=TIMEOUT)
                    classify = f"OK, {len(answer.results)} result"
                except grpc.RpcError as exc:
                    classify = exc.code().name
            finally:
                flood.stop.set()
                flood.call.cancel()  # a client-side cancellation: DEBUG on the server
                poller.stop.set()
                poller.join(timeout=TIMEOUT)
            answered = stream_requests_answered(proc.metrics_url)
        growth = peak - before
        print(
            f"\nflood {FLOOD_SECONDS} s, {FLOOD_REQUEST.ByteSize()} B/message: client sent {sent} "
            f"(bound {SENT_BOUND}), the server answered {answered}; "
            f"server RSS {before / MB:.0f} -> peak {peak / MB:.0f} MB "
            f"(+{growth / MB:.1f} MB, bound {RSS_GROWTH_BOUND / MB:.0f}); "
            f"health answered {poller.answers} times, failures {poller.failures}; "
            f"Classify meanwhile: {classify}"
        )
        assert health_now.status == health_pb2.HealthCheckResponse.SERVING
        assert classify == "OK, 1 result"
        assert poller.answers > 0 and not poller.failures
        assert sent <= SENT_BOUND, "the client was not slowed"
        # What the client sent beyond what the server took (answered, or reading at most
        # FLOOD_INFLIGHT) waits in the flow-control windows: it was held back there.
        assert sent - answered <= FLOOD_INFLIGHT + WINDOW_MESSAGES
        assert growth < RSS_GROWTH_BOUND
        # The cancelled stream leaves no ERROR (nor traceback) in the server's log.
        time.sleep(1)  # let the server log what it would; not a readiness wait
        assert " ERROR " not in proc.text() and "Traceback" not in proc.text(), proc.text()


# -- the limit, in-process -----------------------------------------------------------------------

LIMIT = 2


@pytest.fixture(scope="module")
def limited(tiny_repository: Path) -> Iterator[RunningServer]:
    # max_batch_size 1: a paused batcher holds each request's text as one queued item.
    with running_server(
        tiny_repository, stream_max_inflight=LIMIT, batcher=BatcherConfig(max_batch_size=1)
    ) as srv:
        yield srv


def queue_depth(stub: pb_grpc.ClassifierStub) -> int:
    return int(stub.GetModel(pb.GetModelRequest(), timeout=TIMEOUT).batching.queue_depth)


def test_no_more_than_the_limit_is_processed_at_once(limited: RunningServer) -> None:
    handle = limited.server.repository.get()
    with limited.channel() as channel:
        stub = pb_grpc.ClassifierStub(channel)
        taken: list[str] = []

        def requests() -> Iterator[pb.ClassifyRequest]:
            for i in range(10):
                taken.append(str(i))
                yield pb.ClassifyRequest(id=str(i), texts=["good film"])

        limited.call(handle.batcher.pause)
        try:
            call = stub.ClassifyStream(requests(), timeout=TIMEOUT)
            for _ in range(3000):
                if queue_depth(stub) == LIMIT and len(taken) == 10:
                    break
                time.sleep(0.01)
            # The client has sent all 10 (grpc buffers them), the batcher holds LIMIT requests,
            # and the stream reads no third while they wait.
            assert len(taken) == 10
            time.sleep(0.5)  # give a third request the chance to arrive if it would
            assert queue_depth(stub) == LIMIT
        finally:
            limited.call(handle.batcher.resume)
        responses = list(call)
    assert sorted(r.id for r in responses) == [str(i) for i in range(10)]
    assert all(not r.HasField("error") and len(r.results) == 1 for r in responses)
    assert len(taken) == 10


def test_a_normal_stream_gets_every_response_with_its_id(limited: RunningServer) -> None:
    requests = [
        pb.ClassifyRequest(id=f"r{i}", texts=["good film"] * (i % 4 + 1)) for i in range(50)
    ]
    requests.insert(7, pb.ClassifyRequest(id="bad", texts=[""]))
    with limited.channel() as channel:
        stub = pb_grpc.ClassifierStub(channel)
        responses = {r.id: r for r in stub.ClassifyStream(iter(requests), timeout=TIMEOUT)}
    assert set(responses) == {r.id for r in requests}
    assert all(len(responses[f"r{i}"].results) == i % 4 + 1 for i in range(50))
    assert responses["bad"].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_a_client_cancelling_its_stream_is_logged_at_debug_only(
    limited: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    handle = limited.server.repository.get()
    caplog.set_level(logging.DEBUG, logger="textserve")
    with limited.channel() as channel:
        stub = pb_grpc.ClassifierStub(channel)
        limited.call(handle.batcher.pause)  # requests in flight when the client cancels
        try:
            call = stub.ClassifyStream(
                iter([pb.ClassifyRequest(id=str(i), texts=["good"]) for i in range(5)]),
                timeout=TIMEOUT,
            )
            for _ in range(3000):
                if queue_depth(stub) == LIMIT:
                    break
                time.sleep(0.01)
            call.cancel()
            for _ in range(3000):
                if any("ClassifyStream cancelled" in r.getMessage() for r in caplog.records):
                    break
                time.sleep(0.01)
        finally:
            limited.call(handle.batcher.resume)
    cancelled = [r for r in caplog.records if "ClassifyStream cancelled" in r.getMessage()]
    assert cancelled and all(r.levelno == logging.DEBUG for r in cancelled)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
