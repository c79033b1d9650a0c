"""One worker of `textserve serve --workers 2` drains under load (SIGTERM to it alone: what the
drain of one replica behind a balancer looks like, with the other worker as the other replica).

The drain sends GOAWAY at its start (service/drain.py): a connection to the worker is closed
within a fraction of a second and reconnects to the other worker, while a stream in flight on
the draining worker goes on; callers that send one call after another over connections to both
workers see every call answered OK (none CANCELLED, none refused); /readyz says 503 while the
worker drains; it exits as soon as its in-flight stream ends, not at the end of the grace.
"""

from __future__ import annotations

import os
import queue
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.handmade import make_version
from tests.integration.test_worker_faults import gone, readyz
from tests.integration.test_workers import (
    MODEL,
    TEXTS,
    ClassifyLoad,
    Connection,
    connections_to_every_worker,
    scrape,
)
from tests.serving import poll, serve_subprocess
from textserve.v1 import classifier_pb2 as pb

CALLERS = 2  # closed-loop callers per connection


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    make_version(root, MODEL, 1)
    return root


class HeldStream:
    """A ClassifyStream kept open on a connection: an RPC in flight until close()."""

    def __init__(self, connection: Connection) -> None:
        self._requests: queue.Queue[pb.ClassifyRequest | None] = queue.Queue()
        self._responses = connection.classifier.ClassifyStream(self._feed(), timeout=60)

    def _feed(self) -> Iterator[pb.ClassifyRequest]:
        while (request := self._requests.get()) is not None:
            yield request

    def ask(self) -> pb.ClassifyResponse:
        self._requests.put(pb.ClassifyRequest(texts=TEXTS))
        return next(self._responses)

    def close(self) -> None:
        self._requests.put(None)
        for _ in self._responses:  # the stream ends with OK
            pass


def another_on(address: str, worker: str, first_index: int) -> Connection:
    """A new connection that the kernel gave to `worker`."""
    for index in range(first_index, first_index + 64):
        connection = Connection(address, index)
        if connection.worker == worker:
            return connection
        connection.close()
    pytest.fail(f"64 connections and none on worker {worker}")


def test_a_draining_worker_sends_goaway_at_once_and_loses_no_call(repository: Path) -> None:
    with serve_subprocess(repository, "--workers", "2", "--grace-period", "30") as server:
        assert server.metrics_url is not None
        url = server.metrics_url
        connections = connections_to_every_worker(server.address, 2)
        victim = connections[0].worker  # "INDEX/PID"
        pid = int(victim.split("/")[1])
        probe = another_on(server.address, victim, 100)  # idle: watched for the GOAWAY
        stream = HeldStream(another_on(server.address, victim, 200))
        states: list[grpc.ChannelConnectivity] = []
        probe.channel.subscribe(states.append)
        try:
            assert stream.ask().results
            with ClassifyLoad(connections, callers=CALLERS) as load:
                poll(lambda: load.codes["OK"] >= 200, "load on both workers")
                os.kill(pid, signal.SIGTERM)
                signalled = time.monotonic()
                # GOAWAY: the idle connection to the draining worker is closed at once ...
                poll(lambda: grpc.ChannelConnectivity.IDLE in states, "the GOAWAY", timeout=5)
                goaway = time.monotonic() - signalled
                # ... and a new call on that channel lands on the other worker (the draining
                # one no longer listens; its replacement starts only once it has exited)
                assert probe.ask_worker() != victim
                # while the stream in flight on the draining worker goes on
                assert not gone(pid)
                assert stream.ask().results
                assert readyz(url) == 503  # the supervisor does not count it as ready
                at_goaway = load.codes["OK"]
                poll(lambda: load.codes["OK"] >= at_goaway + 200, "load during the drain")
                stream.close()
                poll(lambda: gone(pid), "the drained worker to exit", timeout=10)
                exited = time.monotonic() - signalled
                done = load.codes["OK"]
                poll(lambda: load.codes["OK"] >= done + 100, "load after the drain")
            samples = scrape(url)
        finally:
            for c in [*connections, probe]:
                c.close()
        text = server.text()
    print(
        f"\nSIGTERM to worker {victim} of 2 under closed-loop load: GOAWAY after {goaway:.2f}s, "
        f"exited {exited:.2f}s after the signal; calls {dict(load.codes)}"
    )
    assert goaway < 2.0, goaway
    # every call answered: nothing cancelled by grpc's shutdown, nothing refused by the drain
    assert set(load.codes) == {"OK"}, load.codes
    assert samples[("textserve_drain_refusals_total", ())] == 0
    assert "held at the drain's gate, 0 refused" in text
