"""`textserve serve --workers N`: a supervisor and N worker processes on one port, as real
processes (tests/serving.py serve_subprocess) on a hand-made model.

Which worker a connection landed on: grpc.health.v1 Check answers carry it in initial metadata
("textserve-worker: INDEX/PID"); each test channel is its own connection (a local subchannel
pool and a channel argument of its own), so it stays on one worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.handmade import make_version
from tests.serving import ROOT, poll, serve_subprocess
from textserve import cli
from textserve.client import AdminClient, Client, connection_options
from textserve.service.health import WORKER_KEY
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

MODEL = "handmade"
TEXTS = ["good film", "awful plot", "a great film and a good plot"]


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    make_version(root, MODEL, 1)
    return root


class Connection:
    """One channel = one connection = one worker."""

    def __init__(self, address: str, index: int) -> None:
        self.channel = grpc.insecure_channel(address, options=connection_options(index, 2))
        self.classifier = pb_grpc.ClassifierStub(self.channel)
        self.worker = self.ask_worker()

    def ask_worker(self) -> str:
        _, call = health_pb2_grpc.HealthStub(self.channel).Check.with_call(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        return dict(call.initial_metadata())[WORKER_KEY]

    def version(self) -> int:
        return int(self.classifier.GetModel(pb.GetModelRequest(name=MODEL), timeout=10).version)

    def close(self) -> None:
        self.channel.close()


class ClassifyLoad:
    """`callers` threads per connection, each sending Classify after Classify until the block
    ends; every outcome counted by status code (`codes`), and by the worker the connection was
    on (`ok`, `failed`). `wait_for_ready`: a call made while the channel reconnects waits for
    it, as a client with a retry policy would; without it, as plain grpc callers do."""

    def __init__(
        self, connections: list[Connection], *, callers: int = 1, wait_for_ready: bool = False
    ) -> None:
        self.ok: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.codes: Counter[str] = Counter()
        self._wait = wait_for_ready
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(c,))
            for c in connections
            for _ in range(callers)
        ]

    def _run(self, connection: Connection) -> None:
        request = pb.ClassifyRequest(texts=TEXTS)
        while not self._stop.is_set():
            try:
                connection.classifier.Classify(request, timeout=30, wait_for_ready=self._wait)
                self.ok[connection.worker] += 1
                self.codes["OK"] += 1
            except grpc.RpcError as exc:
                self.failed[connection.worker] += 1
                self.codes[exc.code().name] += 1

    def __enter__(self) -> ClassifyLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)


def connections_to_every_worker(address: str, workers: int, limit: int = 64) -> list[Connection]:
    """Open connections until every worker has at least one (the kernel picks the worker of
    each connection by a hash of its addresses)."""
    opened: list[Connection] = []
    for index in range(limit):
        opened.append(Connection(address, index))
        if len({c.worker for c in opened}) == workers and len(opened) >= 2 * workers:
            return opened
    seen = Counter(c.worker for c in opened)
    for c in opened:
        c.close()
    pytest.fail(f"{limit} connections reached only the workers {dict(seen)}")


@pytest.fixture
def closing() -> Iterator[list[Connection]]:
    opened: list[Connection] = []
    yield opened
    for c in opened:
        c.close()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def classify_requests(url: str) -> float:
    key = ("textserve_requests_total", (("method", "Classify"), ("model", MODEL)))
    return scrape(url).get(key, 0.0)


def worker_pids(supervisor: int) -> list[int]:
    """The live worker processes of a supervisor (its spawned children; not the
    resource tracker multiprocessing also starts)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if int(fields[1]) == supervisor and b"spawn_main" in command and fields[0] != b"Z":
            pids.append(int(entry))
    return sorted(pids)


def test_every_worker_serves_and_metrics_sum_over_workers(
    repository: Path, closing: list[Connection]
) -> None:
    with serve_subprocess(repository, "--workers", "2") as server:
        poll(lambda: "textserve is serving on" in server.text(), "the ready line")
        assert server.metrics_url is not None
        closing += connections_to_every_worker(server.address, 2)
        per_worker: Counter[str] = Counter()
        sent = 0
        for _ in range(5):
            for c in closing:
                response = c.classifier.Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10)
                assert [r.label for r in response.results]  # answered, one result per text
                assert len(response.results) == len(TEXTS)
                per_worker[c.worker] += 1
                sent += 1
        assert len(per_worker) == 2 and min(per_worker.values()) >= 5, per_worker
        # one /metrics for the whole server: the counters of both workers summed
        assert classify_requests(server.metrics_url) == sent
        samples = scrape(server.metrics_url)
        info = [k for k in samples if k[0] == "textserve_model_info"]
        assert len(info) == 1 and samples[info[0]] == 1.0  # one version served, not one per worker
        assert samples[("textserve_workers", ())] == 2
        assert samples[("process_cpu_seconds_total", ())] > 0
        with urllib.request.urlopen(server.metrics_url.replace("/metrics", "/readyz")) as r:
            assert r.status == 200


def test_the_client_uses_every_worker_over_several_connections(repository: Path) -> None:
    with serve_subprocess(repository, "--workers", "2") as server:
        assert server.metrics_url is not None
        with Client(server.address, connections=16) as client:
            for _ in range(48):
                assert client.classify(TEXTS).predictions
            # its connections land on both workers (16 connections on one: 1 in 32768)
            workers = set()
            for channel in client._channels:
                _, call = health_pb2_grpc.HealthStub(channel).Check.with_call(
                    health_pb2.HealthCheckRequest(), timeout=10
                )
                workers.add(dict(call.initial_metadata())[WORKER_KEY])
        assert len(workers) == 2
        assert classify_requests(server.metrics_url) == 48


def test_sigterm_with_requests_in_flight_on_every_worker_loses_none(
    repository: Path, closing: list[Connection]
) -> None:
    # Requests wait in the workers' queues (batches of up to 128, 10 s delay) until the
    # forwarded SIGTERM's drain runs them; a grace period shorter than the delay proves the
    # drain did not just wait.
    args = ["--max-batch-size", "128", "--max-queue-delay-ms", "10000", "--grace-period", "5"]
    with serve_subprocess(repository, "--workers", "2", *args) as server:
        assert server.metrics_url is not None
        closing += connections_to_every_worker(server.address, 2)
        futures = [
            closing[i % len(closing)].classifier.Classify.future(
                pb.ClassifyRequest(id=str(i), texts=[f"good film {i}"]), timeout=60
            )
            for i in range(100)
        ]
        depth = ("textserve_queue_depth", (("model", MODEL),))
        # the queue depth of the whole server: both workers' queues summed (livesum)
        poll(lambda: scrape(server.metrics_url or "").get(depth) == 100, "100 texts queued")
        server.process.send_signal(signal.SIGTERM)
        responses = [f.result() for f in futures]
        assert server.process.wait(timeout=60) == 0
    assert sorted(int(r.id) for r in responses) == list(range(100))
    assert all(len(r.results) == 1 for r in responses)
    text = server.text()
    assert "SIGTERM received: draining 2 workers" in text
    assert text.count("stopped (status 0)") == 2, text


def test_sigkill_of_a_worker_fails_nothing_our_client_sends_and_it_comes_back(
    repository: Path,
) -> None:
    with serve_subprocess(repository, "--workers", "2") as server:
        assert server.metrics_url is not None
        pids = worker_pids(server.process.pid)
        assert len(pids) == 2
        errors: list[str] = []
        done = Counter[str]()
        stop = threading.Event()

        with Client(server.address, connections=8) as client:

            def caller() -> None:
                while not stop.is_set():
                    try:
                        client.classify(TEXTS)
                        done["ok"] += 1
                    except Exception as exc:  # every failure is the finding
                        errors.append(repr(exc))

            threads = [threading.Thread(target=caller) for _ in range(8)]
            for t in threads:
                t.start()
            poll(lambda: done["ok"] >= 100, "load")
            os.kill(pids[0], signal.SIGKILL)
            restarted = poll(
                lambda: (now := worker_pids(server.process.pid)) and len(now) == 2
                and pids[0] not in now and "): serving" in server.text().split("SIGKILL")[-1]
                and now,
                "the worker's restart",
            )  # fmt: skip
            before = done["ok"]
            poll(lambda: done["ok"] >= before + 100, "load after the restart")
            stop.set()
            for t in threads:
                t.join(timeout=30)
        # the calls in flight on the killed worker got UNAVAILABLE and the channel's retry
        # policy sent them again, to the other worker: the client saw no failure
        assert errors == []
        assert pids[1] in restarted
        samples = scrape(server.metrics_url)
        assert samples[("textserve_worker_restarts_total", (("reason", "exited"),))] == 1
        assert samples[("textserve_worker_restarts_total", (("reason", "unresponsive"),))] == 0
        assert "died with signal SIGKILL; restarting" in server.text()
        # the new worker serves: some connection lands on it
        conns = connections_to_every_worker(server.address, 2)
        assert {int(c.worker.split("/")[1]) for c in conns} == set(restarted)
        for c in conns:
            c.close()


def test_hot_reload_and_admin_reach_every_worker(
    repository: Path, closing: list[Connection]
) -> None:
    with serve_subprocess(
        repository, "--workers", "2", "--enable-admin", "--poll-interval", "0.2"
    ) as server:
        closing += connections_to_every_worker(server.address, 2)
        assert {c.version() for c in closing} == {1}
        # hot reload: each worker's watcher finds version 2
        make_version(repository, MODEL, 2, seed=1)
        poll(lambda: {c.version() for c in closing} == {2}, "version 2 on every worker")
        with AdminClient(server.address) as admin:
            # roll back on one worker: once the call returns, every worker answers version 1
            admin.unload_model(MODEL, 2)
            assert {c.version() for c in closing} == {1}
            admin.load_model(MODEL, 2)
            assert {c.version() for c in closing} == {2}
            admin.unload_model(MODEL)  # the whole model: nothing is served anywhere
            for c in closing:
                with pytest.raises(grpc.RpcError) as info:
                    c.version()
                assert info.value.code() in (
                    grpc.StatusCode.NOT_FOUND,
                    grpc.StatusCode.UNAVAILABLE,
                )
            admin.load_model(MODEL)
            assert {c.version() for c in closing} == {2}


def test_a_restarted_worker_gets_the_admin_changes(
    repository: Path, closing: list[Connection]
) -> None:
    make_version(repository, MODEL, 2, seed=1)
    with serve_subprocess(repository, "--workers", "2", "--enable-admin") as server:
        with AdminClient(server.address) as admin:
            admin.unload_model(MODEL, 2)
        pids = worker_pids(server.process.pid)
        os.kill(pids[0], signal.SIGKILL)
        poll(
            lambda: len(now := worker_pids(server.process.pid)) == 2 and pids[0] not in now,
            "the restart",
        )
        poll(lambda: server.text().count("): serving") >= 3, "the new worker serving")
        closing += connections_to_every_worker(server.address, 2)
        assert {c.version() for c in closing} == {1}


def test_workers_crash_looping_stop_the_server(repository: Path) -> None:
    with serve_subprocess(repository, "--workers", "2") as server:
        supervisor = server.process.pid

        def kill_all() -> bool:
            for pid in worker_pids(supervisor):
                os.kill(pid, signal.SIGKILL)
            return server.process.poll() is not None

        poll(kill_all, "the supervisor to give up", timeout=120)
        assert server.process.returncode == 1
    assert "workers keep dying" in server.text()


def test_a_port_in_use_is_an_error_with_workers(repository: Path, capfd: Any) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(
            ["serve", "--repository", str(repository), "--listen", f"127.0.0.1:{port}",
             "--metrics-port", "off", "--workers", "2"]
        )  # fmt: skip
    assert code == 2
    err = capfd.readouterr().err.strip().splitlines()
    message = f"cannot listen on 127.0.0.1:{port} (Address already in use)"
    assert err == [f"textserve serve: error: {message}"]


def test_a_worker_that_cannot_start_stops_the_server_with_its_error(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "textserve.cli", "serve", "--repository", str(root),
         "--listen", "127.0.0.1:0", "--metrics-port", "off", "--workers", "2"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"textserve serve: error: no model versions in {root}"), done.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "--workers must be at least 1 (or 'auto'), got 0"),
        ("-2", "--workers must be at least 1 (or 'auto'), got -2"),
        ("two", "--workers must be a whole number of processes or 'auto', got 'two'"),
        ("1.5", "--workers must be a whole number of processes or 'auto', got '1.5'"),
    ],
)
def test_bad_workers_values_are_one_line_and_status_2(
    repository: Path, capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    code = cli.main(["serve", "--repository", str(repository), "--workers", value])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"textserve serve: error: {message}"]


def test_more_workers_than_memory_holds_is_one_line(
    repository: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code = cli.main(["serve", "--repository", str(repository), "--workers", "100000"])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("textserve serve: error: --workers 100000 needs about ")
    assert "MiB are available: use at most" in lines[0]
    # the environment variable too, named as such
    monkeypatch.setenv("TEXTSERVE_WORKERS", "0")
    assert cli.main(["serve", "--repository", str(repository)]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err


def test_workers_stop_when_the_supervisor_is_killed(repository: Path) -> None:
    with serve_subprocess(repository, "--workers", "2") as server:
        pids = worker_pids(server.process.pid)
        assert len(pids) == 2
        server.process.kill()  # SIGKILL: no forwarding; the workers see their pipe close
        server.process.wait(timeout=30)

        def gone(pid: int) -> bool:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    return f.read().rpartition(b")")[2].split()[0] == b"Z"
            except OSError:
                return True

        poll(lambda: all(gone(pid) for pid in pids), "the orphaned workers to drain and exit")
