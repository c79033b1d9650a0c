"""Faults of `textserve serve --workers 2`: the supervisor's heartbeat catches a worker that
stops answering (SIGSTOP stands in for a worker wedged in a native call; a handler that sleeps
on the main thread blocks a running worker's event loop), /readyz goes 503 within
--worker-timeout, the worker is killed and replaced, and callers fail only for what was in
flight on it; a SIGKILLed supervisor's metrics folder is removed by the next start."""

from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.handmade import make_version
from tests.integration.test_workers import (
    MODEL,
    ClassifyLoad,
    connections_to_every_worker,
    scrape,
    worker_pids,
)
from tests.serving import poll, serve_subprocess
from textserve.bench.soak import Load as OpenLoad

TIMEOUT = 2.0  # --worker-timeout of the test: short, so that the test is quick

# Imported by every Python process started with this folder first on PYTHONPATH (the site
# module's hook): SIGUSR1 then runs a handler that sleeps on the main thread, which is where a
# worker's event loop runs, so the process is alive, scheduled and holding its sockets, but its
# loop is blocked, as by a long synchronous call in a handler. Nothing in textserve knows of it.
BLOCKING_HOOK = """
import signal, time
signal.signal(signal.SIGUSR1, lambda *_: time.sleep(3600))
"""


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    make_version(root, MODEL, 1)
    return root


def readyz(metrics_url: str, timeout: float = 5.0) -> int:
    """/readyz's status; 0 when there is no answer (the HTTP port is shared by the workers: a
    probe whose connection lands on the stopped worker waits, as a kubelet's would, and fails)."""
    try:
        url = metrics_url.replace("/metrics", "/readyz")
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, TimeoutError):
        return 0


@pytest.mark.parametrize("fault", ["stopped", "blocked"])
def test_a_stopped_or_blocked_worker_is_caught_by_the_heartbeat_and_replaced(
    repository: Path, tmp_path: Path, fault: str
) -> None:
    """stopped: SIGSTOP (a process wedged outside Python); blocked: its event loop blocked by a
    synchronous sleep while the process runs (BLOCKING_HOOK)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(BLOCKING_HOOK)
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    flags = ("--workers", "2", "--worker-timeout", str(TIMEOUT))
    with serve_subprocess(repository, *flags, env={"PYTHONPATH": path}) as server:
        assert server.metrics_url is not None
        url = server.metrics_url
        connections = connections_to_every_worker(server.address, 2)
        try:
            victim = connections[0].worker  # "INDEX/PID"
            pid = int(victim.split("/")[1])
            on_victim = sum(c.worker == victim for c in connections)
            with ClassifyLoad(connections, wait_for_ready=True) as load:
                poll(lambda: len(load.ok) == 2 and min(load.ok.values()) >= 5, "load")
                poll(lambda: readyz(url) == 200, "/readyz 200")
                os.kill(pid, signal.SIGSTOP if fault == "stopped" else signal.SIGUSR1)
                stopped = time.monotonic()
                # a real 503 from the supervisor's readiness, not a probe that got no answer
                poll(lambda: readyz(url, 0.5) == 503, "/readyz 503", timeout=30, interval=0.02)
                noticed = time.monotonic() - stopped
                replaced = poll(
                    lambda: pid not in (now := worker_pids(server.process.pid))
                    and len(now) == 2 and readyz(url) == 200 and now,
                    "the replacement serving", timeout=60,
                )  # fmt: skip
                served = sum(load.ok.values())
                poll(lambda: sum(load.ok.values()) >= served + 20, "load after the restart")
            samples = scrape(url)
        finally:
            for c in connections:
                c.close()
        text = server.text()
    print(
        f"\n{fault} worker {victim}: /readyz 503 after {noticed:.2f}s "
        f"(--worker-timeout {TIMEOUT:g}s); ok {dict(load.ok)}, failed {dict(load.failed)} "
        f"{dict(load.codes)}; {on_victim} of {len(connections)} connections on it"
    )
    # noticed within the deadline (plus a ping interval and the probe's own polling)
    assert noticed <= TIMEOUT + 1.5, noticed
    assert len(replaced) == 2
    assert f"pid {pid}): unresponsive" in text and "died with signal SIGKILL (unresponsive)" in text
    # the survivor was told (PeerLost): its backlog does not judge the load it inherits overload
    assert text.count("another worker died: its clients come here too") == 1, text[-3000:]
    assert samples[("textserve_worker_restarts_total", (("reason", "unresponsive"),))] == 1
    assert samples[("textserve_worker_restarts_total", (("reason", "exited"),))] == 0
    # only calls of the stopped worker's connections failed, none on the other worker: the one
    # in flight when it stopped, and at most one more per connection (a call that raced the
    # SIGKILL while its channel reconnected: seen once in a CI run, 4 failures on 3 connections)
    assert set(load.failed) <= {victim}, load.failed
    assert load.failed[victim] <= 2 * on_victim, (load.failed, on_victim)
    assert set(load.codes) - {"OK"} <= {"UNAVAILABLE"}, load.codes


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] == b"Z"
    except OSError:
        return True


def test_a_sigkilled_supervisors_metrics_folder_is_removed_at_the_next_start(
    repository: Path, tmp_path: Path
) -> None:
    temporary = tmp_path / "tmp"  # the servers' temporary directory (TMPDIR), ours alone
    temporary.mkdir()
    env = {"TMPDIR": str(temporary)}
    with serve_subprocess(repository, "--workers", "2", env=env) as server:
        (left,) = temporary.glob("textserve-metrics-*")
        pids = worker_pids(server.process.pid)
        server.process.kill()  # SIGKILL: no cleanup of its own
        server.process.wait(timeout=30)
        poll(lambda: all(gone(pid) for pid in pids), "the orphaned workers to exit")
    assert left.is_dir() and any(left.glob("*.db"))  # what a SIGKILL leaves behind
    with serve_subprocess(repository, "--workers", "2", env=env) as again:
        (now,) = temporary.glob("textserve-metrics-*")
        assert now != left and not left.exists()
        said = f"removed {left}: its server (pid {server.process.pid}) is gone"
        poll(lambda: said in again.text(), "the removal's log line")
        again.process.terminate()
        assert again.process.wait(timeout=60) == 0
    assert not list(temporary.glob("textserve-metrics-*"))  # a clean exit removes its own


def test_sigterm_under_load_answers_ok_or_unavailable_never_cancelled(repository: Path) -> None:
    """Raw grpc.aio callers (no retry policy) over four connections to two workers while the
    supervisor forwards SIGTERM: a call that arrives once the drain began is held by the
    drain's gate and served, or, once no worker listens, refused by the kernel (UNAVAILABLE,
    connection refused); never CANCELLED by grpc's shutdown (service/drain.py)."""
    with serve_subprocess(repository, "--workers", "2", "--grace-period", "30") as server:
        load = OpenLoad(server.address, rate=150, connections=4, stream=False).start()
        try:
            poll(lambda: load.codes["OK"] >= 100, "load")
            server.process.send_signal(signal.SIGTERM)
            poll(lambda: load.codes["UNAVAILABLE"] >= 50, "calls during the drain")
        finally:
            load.stop()
        status = server.process.wait(timeout=60)
    print(f"\nSIGTERM under load, 2 workers: {dict(load.codes)}")
    assert status == 0
    assert set(load.codes) == {"OK", "UNAVAILABLE"}, load.codes
    assert all("Connection refused" in m for m in load.messages), load.messages
