"""Retiring versions and shutting the repository down, as an operator and a client meet them.

Guards what the log tells the operator about a model's versions (a refused version and the one
that keeps serving, a version policy that changes or a serving.json that is wrong — said once —,
a version retired then unloaded), how long a retired version waits for the requests that picked
it (the grace period, not for ever), and what flush() and close() do to queued requests and to
loads in flight. Real repositories of tests/handmade.py versions; no gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import pytest

from tests.handmade import make_version
from tests.serving import run_repository as run
from tests.unit.service.repository.helpers import break_checksum, drained, failures, ready_versions
from textserve.service.config import BatcherConfig
from textserve.service.engine.handle import ClassifyResult
from textserve.service.errors import NotReadyError
from textserve.service.repository.core import ModelRepository, State
from textserve.service.repository.policy import PolicyError, read_serving_file

CORE = "textserve.service.repository.core"


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    """The repository's log lines at `level`, as an operator reads them."""
    return [r.getMessage() for r in caplog.records if r.name == CORE and r.levelno == level]


def test_a_refusal_is_logged_with_the_version_that_keeps_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_version(tmp_path, "m", 1)
    break_checksum(make_version(tmp_path, "m", 2))

    async def body(repository: ModelRepository) -> None:
        versions = repository.models["m"].versions
        # At startup version 2 is tried first, while nothing serves yet.
        assert lines(caplog, logging.ERROR) == [
            f"model m version 2 refused (checksum_mismatch): {versions[2].reason}"
        ]
        caplog.clear()
        break_checksum(make_version(tmp_path, "m", 3))
        await repository.reconcile()
        assert lines(caplog, logging.ERROR) == [
            f"model m version 3 refused (checksum_mismatch): {versions[3].reason}; "
            "version 1 keeps serving"
        ]
        assert repository.get().version == 1

    with caplog.at_level(logging.INFO, logger=CORE):
        metrics = run(tmp_path, body)
    assert failures(metrics, "checksum_mismatch") == 2


def test_a_policy_change_retires_the_old_version_and_the_log_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_version(tmp_path, "m", 1)
    make_version(tmp_path, "m", 2)

    async def body(repository: ModelRepository) -> None:
        assert repository.get().version == 2
        caplog.clear()
        (tmp_path / "m" / "serving.json").write_text('{"version_policy": "specific:1"}')
        await repository.reconcile()
        await drained(repository)
        assert repository.get().version == 1
        assert repository.models["m"].versions[2].state is State.AVAILABLE
        said = [line for line in lines(caplog, logging.INFO) if " ready on " not in line]
        assert said == [
            "model m: version policy latest:1 -> specific:1",
            "model m version 2 retired; draining",
            "model m version 2 unloaded",
        ]

    with caplog.at_level(logging.INFO, logger=CORE):
        run(tmp_path, body)


def test_an_unloaded_version_gives_its_memory_back_to_the_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a retired version's handle is dropped, the allocator's free pages are returned
    (engine/memory.py: malloc_trim), off the event loop: once per unloaded version."""
    make_version(tmp_path, "m", 1)
    make_version(tmp_path, "m", 2)
    calls: list[tuple[str | None, bool]] = []

    def release() -> int:
        entry = repository_ref[0].models["m"].versions[2]
        calls.append((threading.current_thread().name, entry.handle is None))
        return 0

    monkeypatch.setattr(f"{CORE}.release_freed_memory", release)
    repository_ref: list[ModelRepository] = []

    async def body(repository: ModelRepository) -> None:
        repository_ref.append(repository)
        (tmp_path / "m" / "serving.json").write_text('{"version_policy": "specific:1"}')
        await repository.reconcile()
        await drained(repository)
        assert repository.get().version == 1
        deadline = time.monotonic() + 30  # a guard against a hang, not a timing
        while not calls:  # on an executor thread, not awaited by the drain
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

    run(tmp_path, body)
    assert len(calls) == 1
    thread, dropped = calls[0]
    assert dropped and thread != threading.main_thread().name  # after the drop, not on the loop


def test_a_bad_serving_json_is_logged_once_per_problem_and_the_policy_in_force_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_version(tmp_path, "m", 1)
    make_version(tmp_path, "m", 2)
    serving = tmp_path / "m" / "serving.json"
    serving.write_text('{"version_policy": "specific:1"}')

    def problem(text: str) -> str:
        serving.write_text(text)
        with pytest.raises(PolicyError) as raised:
            read_serving_file(tmp_path / "m")
        return str(raised.value)

    async def body(repository: ModelRepository) -> None:
        unknown, not_an_object = problem('{"version_policy": "newest"}'), problem("[]")
        for text, expected in (
            ('{"version_policy": "newest"}', unknown),
            ("[]", not_an_object),  # another problem: said too
            ('{"version_policy": "specific:1"}', None),  # fixed
            ('{"version_policy": "newest"}', unknown),  # broken again: said again
        ):
            caplog.clear()
            serving.write_text(text)
            for _ in range(3):  # at every scan, said once
                assert await repository.reconcile() == []
            said = [f"{expected}; keeping version policy specific:1"] if expected else []
            assert lines(caplog, logging.ERROR) == said
            assert ready_versions(repository, "m") == [1]

    with caplog.at_level(logging.INFO, logger=CORE):
        run(tmp_path, body)


def test_a_retired_version_waits_for_its_requests_only_for_the_grace_period(
    tmp_path: Path,
) -> None:
    grace = 0.05
    make_version(tmp_path, "m", 1)
    make_version(tmp_path, "m", 2)

    async def body(repository: ModelRepository) -> None:
        old = repository.get()
        gate = threading.Event()
        try:
            # Hold the (single) inference thread: the request that picked version 2 cannot end.
            old.batcher._executor.submit(gate.wait, 30)
            request = asyncio.create_task(old.classify(["a good film"]))
            # One step: classify() counts itself in on version 2 before its first await.
            await asyncio.sleep(0)
            # Returns once drained; without the grace period it would wait for the request:
            # fail long before that instead of hanging.
            await asyncio.wait_for(repository.unload_model("m", 2), grace * 100)
            with pytest.raises(NotReadyError):
                await request  # cut short when the grace period ran out
        finally:
            gate.set()
        assert repository.models["m"].versions[2].state is State.AVAILABLE
        assert repository.get().version == 1
        assert not repository._drains  # nothing left behind for close() to cancel

    run(tmp_path, body, grace_period=grace)


async def queued(repository: ModelRepository) -> asyncio.Task[ClassifyResult]:
    """A request to the served version, waiting in its queue."""
    handle = repository.get()
    request = asyncio.create_task(handle.classify(["a good film"]))
    while handle.stats().queue_depth == 0:  # polling: the request reaches the queue
        await asyncio.sleep(0)
    return request


def test_flush_runs_what_is_queued_without_waiting_for_the_batch_to_fill(tmp_path: Path) -> None:
    delay = 10.0  # the most a text waits for its batch to fill
    make_version(tmp_path, "m", 1)

    async def body(repository: ModelRepository) -> None:
        request = await queued(repository)
        repository.flush()
        # Without the flush the batch would start after `delay`: fail at half of it instead.
        result = await asyncio.wait_for(request, delay / 2)
        assert result.probabilities.shape == (1, 2)

    run(tmp_path, body, batcher=BatcherConfig(max_queue_delay=delay))


def test_close_refuses_what_is_queued_at_once_and_serves_nothing_after(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)

    async def body(repository: ModelRepository) -> None:
        repository.get().batcher.pause()  # the request stays queued until close() decides
        request = await queued(repository)
        await repository.close()
        with pytest.raises(NotReadyError, match="shut down before this request ran"):
            await request  # refused, not run: close() gives queued work no time by default
        assert not repository.serving()
        assert repository.models["m"].versions[1].state is State.AVAILABLE
        with pytest.raises(NotReadyError, match="no ready version"):
            repository.get()

    run(tmp_path, body)


def test_close_cancels_a_load_in_flight_and_waits_for_it_to_stop(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)

    async def body(repository: ModelRepository) -> None:
        await repository.unload_model("m")  # nothing serves: close() has no handle to wait on
        load = asyncio.create_task(repository.load_model("m"))
        entry = repository.models["m"].versions[1]
        while entry.state is not State.LOADING:  # polling: the load has started
            await asyncio.sleep(0)
        await asyncio.sleep(0)  # one step more: the load task runs (it is reading the files)
        await repository.close()  # raises nothing
        assert entry.state is State.AVAILABLE  # the cancelled load has stopped, not "loading"
        with pytest.raises(asyncio.CancelledError):
            await load
        assert not repository.serving()

    run(tmp_path, body)
