"""The supervisor's restart backoff, without processes: the delay before a worker is restarted
doubles with its deaths in a row (0.5 s, 1 s, 2 s, ... at most BACKOFF_MAX) and starts again
from BACKOFF_FIRST once the worker has served; too many deaths within CRASH_WINDOW stop the
server. The supervisor driving its workers' Lifecycle (test_lifecycle.py tests it alone)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from textserve.service.config import ServerConfig
from textserve.service.workers import supervisor as module
from textserve.service.workers.lifecycle import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    CRASH_LIMIT,
    WorkerState,
)
from textserve.service.workers.supervisor import Supervisor, _Worker


class DeadProcess:
    exitcode = -9  # SIGKILL

    def join(self) -> None:
        pass


@pytest.fixture
def supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Supervisor:
    monkeypatch.setattr(module, "mark_dead", lambda pid, directory: None)
    s = Supervisor(ServerConfig(repository=tmp_path), workers=1)
    s.metrics_dir, s.on_ready = str(tmp_path), None
    s._started = True  # the server served once: deaths are restarted, not fatal
    return s


def die(s: Supervisor, worker: _Worker) -> float:
    """The worker dies; the delay until its restart."""
    if not worker.life.live:
        worker.life.spawned(time.monotonic())
    worker.process, worker.pid = DeadProcess(), 4242  # type: ignore[assignment]
    s._exited(worker)
    assert worker.life.state is WorkerState.RESTARTING
    assert worker.life.restart_at is not None
    return worker.life.restart_at - time.monotonic()


def test_the_delay_doubles_with_deaths_in_a_row_and_resets_once_it_serves(
    supervisor: Supervisor,
) -> None:
    worker = supervisor.workers[0]
    delays = []
    for _ in range(CRASH_LIMIT - 1):
        delays.append(die(supervisor, worker))
        supervisor._deaths.deaths.clear()  # spread out in time: no crash loop
    expected = [min(BACKOFF_MAX, BACKOFF_FIRST * 2**i) for i in range(CRASH_LIMIT - 1)]
    assert delays == pytest.approx(expected, abs=0.05)
    worker.life.spawned(time.monotonic())  # it came back and served
    worker.life.warm()
    worker.life.reported("serving")
    assert die(supervisor, worker) == pytest.approx(BACKOFF_FIRST, abs=0.05)


def test_the_delay_is_capped(supervisor: Supervisor) -> None:
    worker = supervisor.workers[0]
    worker.life.deaths_in_a_row = 30
    assert die(supervisor, worker) == pytest.approx(BACKOFF_MAX, abs=0.05)


def test_deaths_in_quick_succession_stop_the_server(supervisor: Supervisor) -> None:
    worker = supervisor.workers[0]
    for _ in range(CRASH_LIMIT - 1):
        die(supervisor, worker)
    worker.life.spawned(time.monotonic())
    worker.process, worker.pid = DeadProcess(), 4242  # type: ignore[assignment]
    supervisor._exited(worker)
    assert supervisor._fatal is not None and "workers keep dying" in str(supervisor._fatal)
    assert supervisor._fatal.status == 1
    assert worker.life.state is WorkerState.FAILED


def test_a_silent_worker_is_recorded_unresponsive_before_it_is_killed(
    supervisor: Supervisor,
) -> None:
    """The kill's SIGCHLD/sentinel may be read at once: by then the worker must already be
    recorded as killed for being unresponsive (its restart reason and readiness), or its
    death would be counted as a crash."""
    recorded: list[tuple[WorkerState, str]] = []
    worker = supervisor.workers[0]

    class Silent:
        def kill(self) -> None:
            recorded.append((worker.life.state, worker.life.text))

    worker.life.spawned(time.monotonic() - supervisor.config.worker_timeout - 1)
    worker.life.warm()
    worker.life.reported("serving")
    worker.process, worker.pid = Silent(), 4242  # type: ignore[assignment]
    worker.conn = object()  # type: ignore[assignment]
    supervisor._heartbeat(time.monotonic())
    assert recorded == [(WorkerState.UNRESPONSIVE, "unresponsive")]
    worker.process = DeadProcess()  # type: ignore[assignment]
    worker.conn = None
    supervisor._exited(worker)
    assert worker.life.restart_reason == "unresponsive"
    assert worker.life.text.startswith("died with signal SIGKILL (unresponsive); restarting in")
