"""--engine shared (service/engine/hub.py) on real servers: `textserve serve --workers 2` with one
engine process for both workers. Every worker's answers are the thread engine's; batches from
the two workers run together (a session run larger than one worker's batch cap); one engine
process holds the version whichever worker sent it, a hot reload replaces it there, and a killed
engine process is started again by the supervisor (the batch it held fails INTERNAL, the next
ones are answered)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest

from tests.handmade import make_version
from tests.integration.test_inference_priority import niceness
from tests.integration.test_workers import Connection, connections_to_every_worker, scrape
from tests.serving import RunningServer, poll, running_server, serve_subprocess
from textserve.bench.process import ServerProcess
from textserve.service.config import RuntimeConfig
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

MODEL = "handmade"
TEXTS = ["a good film", "the plot is bad", "great great film", "awful", "a film", "good plot"]
CAP = 4  # --max-batch-size of each worker: a run of more texts is two workers' batches merged


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    make_version(root, MODEL, 1, max_length=8)
    return root


def hub_pid(server: ServerProcess) -> int:
    found = poll(lambda: re.findall(r"shared engine \(pid (\d+)\)", server.text()), "the hub")
    return int(found[-1])


def classify(c: Connection | pb_grpc.ClassifierStub, texts: list[str]) -> pb.ClassifyResponse:
    stub = c.classifier if isinstance(c, Connection) else c
    request = pb.ClassifyRequest(model=MODEL, texts=texts, all_scores=True)
    return stub.Classify(request, timeout=30)


def scores(response: pb.ClassifyResponse) -> list[list[float]]:
    return [list(r.scores) for r in response.results]


def merged_runs(url: str) -> tuple[float, float]:
    """(session runs of more than CAP texts, all runs), every worker's metrics summed."""
    samples = scrape(url)
    total = samples.get(("textserve_batch_size_count", (("model", MODEL),)), 0.0)
    small = samples.get(("textserve_batch_size_bucket", (("le", "4.0"), ("model", MODEL))), 0.0)
    return total - small, total


def load(connections: list[Connection], rounds: int, expected: list[list[float]]) -> None:
    """Threads on every connection, each sending TEXTS `rounds` times, checking each answer."""
    failures: list[BaseException] = []

    def caller(c: Connection, offset: int) -> None:
        try:
            for n in range(rounds):
                cut = (offset + n) % len(TEXTS) + 1  # requests of 1 to 6 texts
                got = scores(classify(c, TEXTS[:cut]))
                np.testing.assert_allclose(got, expected[:cut], rtol=0, atol=1e-6)
        except BaseException as exc:
            failures.append(exc)

    threads = [
        threading.Thread(target=caller, args=(c, i * 3 + k))
        for i, c in enumerate(connections)
        for k in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures[0]


@pytest.fixture(scope="module")
def thread_answers(tmp_path_factory: pytest.TempPathFactory) -> list[list[float]]:
    root = tmp_path_factory.mktemp("models")
    make_version(root, MODEL, 1, max_length=8)
    with running_server(root) as srv, srv.channel() as channel:
        return scores(classify(pb_grpc.ClassifierStub(channel), TEXTS))


def every_worker(server: ServerProcess, stack: contextlib.ExitStack) -> list[Connection]:
    opened = connections_to_every_worker(server.address, 2)
    for c in opened:
        stack.callback(c.close)
    return opened


def test_both_workers_answer_from_one_engine_with_merged_batches(
    repository: Path, thread_answers: list[list[float]]
) -> None:
    args = ("--workers", "2", "--engine", "shared", "--max-batch-size", str(CAP))
    with serve_subprocess(repository, *args) as server, contextlib.ExitStack() as stack:
        assert server.metrics_url is not None and server.pid is not None
        hub = hub_pid(server)
        children = {p.pid for p in psutil.Process(server.pid).children()}
        assert hub in children
        base = psutil.Process(server.pid).nice()  # --inference-nice 10: the hub below the loops
        assert {niceness(t.id) for t in psutil.Process(hub).threads()} == {min(19, base + 10)}
        assert {psutil.Process(pid).nice() for pid in children - {hub}} == {base}
        load(every_worker(server, stack), 30, thread_answers)
        merged, runs = merged_runs(server.metrics_url)
        assert runs > 0
        assert merged > 0, f"no session run took more than one worker's batch ({runs} runs)"
        # one process holds the version's session: the workers hold no engine of their own
        for worker in psutil.Process(server.pid).children():
            assert not [p for p in worker.children() if p.name().startswith("python")]
        assert "handmade-1 loaded (1 versions)" in server.text()


def test_hot_reload_and_a_killed_engine(repository: Path) -> None:
    args = ("--workers", "2", "--engine", "shared", "--poll-interval", "0.2")
    with serve_subprocess(repository, *args) as server, contextlib.ExitStack() as stack:
        closing = every_worker(server, stack)
        first = hub_pid(server)
        make_version(repository, MODEL, 2, max_length=8, seed=1)
        poll(lambda: all(c.version() == 2 for c in closing), "version 2 on every worker")
        poll(lambda: "handmade-1 released" in server.text(), "version 1 let go in the hub")
        assert {classify(c, TEXTS).model_version for c in closing} == {2}
        os.kill(first, signal.SIGKILL)
        second = poll(lambda: hub_pid(server) if hub_pid(server) != first else None, "a new hub")
        codes = set()
        for c in closing:  # each worker: the batch the dead hub held fails, the next is answered
            try:
                classify(c, TEXTS)
            except grpc.RpcError as exc:
                codes.add(exc.code())
            assert len(classify(c, TEXTS).results) == len(TEXTS)
        assert codes <= {grpc.StatusCode.INTERNAL}
        assert psutil.pid_exists(second)
    assert not psutil.pid_exists(second) or psutil.Process(second).status() == "zombie"


def test_one_process_takes_shared_as_process(repository: Path) -> None:
    runtime = RuntimeConfig(intra_op_threads=1, engine="shared")
    with running_server(repository, runtime=runtime) as srv, srv.channel() as channel:
        engine_of(srv)  # a process of the version's own, as --engine process
        answer = classify(pb_grpc.ClassifierStub(channel), TEXTS)
        assert len(answer.results) == len(TEXTS)


def engine_of(srv: RunningServer) -> int:
    pid = srv.server.repository.get()._engine.pid  # type: ignore[union-attr]
    assert pid is not None and pid != os.getpid()
    return int(pid)
