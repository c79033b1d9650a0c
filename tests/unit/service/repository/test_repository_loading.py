"""Loading and unloading versions in the model repository, as operators and clients meet it.

Guards what `ModelRepository` promises around a load: the "ready on" line and the model's
series at zero once a version serves; unforeseen errors and a device lost after startup refuse
the version (with the reason, the counted label, the traceback at debug level) while the
serving one goes on; a load cut short is tried again; a reconcile scans once and an unload
loads nothing; versions unloaded by hand stop serving at once and unpin; LoadModel retries
refused versions and says when none loads; UnloadModel returns once its own versions (not
another model's) are released; `get` names the state and reason of a version that does not
serve; `on_change` is told whether anything is served. Real repositories of hand-made versions
(tests/handmade.py) and real onnxruntime sessions; a wrapped `load_version_dir` only where a
load must be held, or must fail in a way no file on disk can cause.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.handmade import make_version
from tests.serving import repository_config
from tests.serving import run_repository as run
from tests.unit.service.repository.helpers import (
    break_checksum,
    failures,
    ready_models,
    ready_versions,
)
from textserve.service.config import RuntimeConfig
from textserve.service.engine.runtime import DeviceUnavailableError
from textserve.service.errors import LoadFailedError, NotReadyError
from textserve.service.metrics import Metrics
from textserve.service.repository import core
from textserve.service.repository.core import ModelRepository, ReloadEvent, State
from textserve.service.repository.records import VersionRecord

LOGGER = "textserve.service.repository.core"


def actions(events: list[ReloadEvent]) -> list[tuple[int, str]]:
    return [(e.version, e.action) for e in events]


class HeldLoad:
    """Wraps core.load_version_dir so that the first load of `version` waits for `release()`
    (a slow hash, a hung mount); `entered` is set once it waits. Other loads run as usual."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, version: int) -> None:
        self.version = version
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.real = core.load_version_dir
        monkeypatch.setattr(core, "load_version_dir", self.load)

    def load(self, path: Path, *args: Any, **kwargs: Any) -> Any:
        if path.name == str(self.version) and not self.entered.is_set():
            self.entered.set()
            self.gate.wait(60)
        return self.real(path, *args, **kwargs)

    async def wait_entered(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.entered.wait, 60)

    def release(self) -> None:
        self.gate.set()


def fail_loading(monkeypatch: pytest.MonkeyPatch, version: int, exc: BaseException) -> None:
    """Loading `version` of any model raises `exc` (after the version's files were read)."""
    real = core.load_version_dir

    def load(path: Path, *args: Any, **kwargs: Any) -> Any:
        if path.name == str(version):
            raise exc
        return real(path, *args, **kwargs)

    monkeypatch.setattr(core, "load_version_dir", load)


async def yield_until(done: Any, steps: int = 50) -> None:
    """Let the event loop run up to `steps` steps (no wall-clock wait) until done() holds."""
    for _ in range(steps):
        if done():
            return
        await asyncio.sleep(0)


# -- a version that loads --------------------------------------------------------------------


def test_a_loaded_version_is_logged_with_its_provider_and_its_series_start_at_zero(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_version(tmp_path, "m", 1)

    async def body(repository: ModelRepository) -> None:
        make_version(tmp_path, "m", 2, seed=1)
        assert actions(await repository.reconcile()) == [(2, "loaded"), (1, "unloaded")]

    with caplog.at_level(logging.INFO, logger=LOGGER):
        metrics = run(tmp_path, body)
    ready = [r.getMessage() for r in caplog.records if "ready on" in r.getMessage()]
    said = "ready on CPUExecutionProvider (labels negative, positive, max_length 8)"
    assert ready == [f"model m version 1 {said}", f"model m version 2 {said}"]
    # nor anything at ERROR, the event loop's "Exception in callback" included
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    value = metrics.registry.get_sample_value
    # README: every series of a model exists, at zero, as soon as the model is loaded
    assert value("textserve_requests_total", {"method": "Classify", "model": "m"}) == 0
    assert value("textserve_model_load_failures_total", {"model": "m", "reason": "other"}) == 0


# -- versions refused or cut short ------------------------------------------------------------


def test_an_unforeseen_load_error_refuses_the_version_with_its_traceback_at_debug_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    make_version(tmp_path, "m", 1)
    fail_loading(monkeypatch, 2, ZeroDivisionError("a check nobody foresaw"))
    reason = "unexpected ZeroDivisionError: a check nobody foresaw"

    async def body(repository: ModelRepository) -> None:
        make_version(tmp_path, "m", 2, seed=1)
        assert await repository.reconcile() == [ReloadEvent("m", 2, "refused", reason)]
        assert repository.get().version == 1

    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        metrics = run(tmp_path, body)
    assert failures(metrics, "other") == 1
    [record] = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    assert "model m version 2" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is ZeroDivisionError


def test_a_device_lost_after_startup_refuses_the_version_as_a_session_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_version(tmp_path, "m", 1)
    lost = "--device cuda: CUDA is no longer available"
    fail_loading(monkeypatch, 2, DeviceUnavailableError(lost))

    async def body(repository: ModelRepository) -> None:
        make_version(tmp_path, "m", 2, seed=1)
        assert await repository.reconcile() == [ReloadEvent("m", 2, "refused", lost)]
        assert repository.get().version == 1  # the server goes on with what it serves

    metrics = run(tmp_path, body)
    assert failures(metrics, "session_error") == 1
    assert failures(metrics, "other") == 0


def test_a_missing_device_at_startup_is_a_configuration_error_not_the_versions(
    tmp_path: Path,
) -> None:
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("CUDA is available here")
    make_version(tmp_path, "m", 1)
    config = repository_config(tmp_path, runtime=RuntimeConfig(device="cuda", intra_op_threads=1))
    metrics = Metrics(CollectorRegistry())
    repository = ModelRepository.from_server(config, metrics)

    async def main() -> None:
        try:
            with pytest.raises(DeviceUnavailableError, match="--device cuda"):
                await repository.load_all()
        finally:
            await repository.close()

    asyncio.run(main())
    assert repository.models["m"].describe() == "m [versions 1 (available)]"
    assert failures(metrics, "session_error") == 0  # not counted against the version


def test_a_load_cut_short_is_tried_again_at_the_next_reconcile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_version(tmp_path, "m", 1)
    held = HeldLoad(monkeypatch, 2)

    async def body(repository: ModelRepository) -> None:
        make_version(tmp_path, "m", 2, seed=1)
        reconcile = asyncio.create_task(repository.reconcile())
        try:
            await held.wait_entered()
            reconcile.cancel()  # e.g. the admin client went away, or shutdown
            with pytest.raises(asyncio.CancelledError):
                await reconcile
            assert repository.models["m"].describe() == "m [versions 1 (ready), 2 (available)]"
            assert repository.get().version == 1
        finally:
            held.release()
        assert actions(await repository.reconcile()) == [(2, "loaded"), (1, "unloaded")]

    run(tmp_path, body)


def test_a_load_cancelled_before_it_began_is_tried_again_at_the_next_reconcile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reconcile is cancelled in the very loop step that starts the load (an admin
    client's deadline can land there): the load task never runs a line of its own."""
    make_version(tmp_path, "m", 1)
    real = VersionRecord.start_loading  # in the decision's step that starts the load task
    armed = False

    def start_loading(entry: VersionRecord) -> None:
        nonlocal armed
        if armed:
            armed = False
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # takes effect at the reconcile's next await: its wait for the load
        real(entry)

    monkeypatch.setattr(VersionRecord, "start_loading", start_loading)

    async def body(repository: ModelRepository) -> None:
        nonlocal armed
        make_version(tmp_path, "m", 2, seed=1)
        armed = True
        with pytest.raises(asyncio.CancelledError):
            await asyncio.create_task(repository.reconcile())
        assert repository.models["m"].describe() == "m [versions 1 (ready), 2 (available)]"
        assert actions(await repository.reconcile()) == [(2, "loaded"), (1, "unloaded")]

    run(tmp_path, body)


# -- what one reconcile or admin call does ----------------------------------------------------


def test_a_reconcile_scans_once_so_a_version_published_while_it_loads_waits_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_version(tmp_path, "m", 1)
    real = core.load_version_dir

    def load(path: Path, *args: Any, **kwargs: Any) -> Any:
        if path.name == "2" and not (tmp_path / "m" / "3").exists():
            make_version(tmp_path, "m", 3, seed=2)  # a publisher that keeps publishing
        return real(path, *args, **kwargs)

    monkeypatch.setattr(core, "load_version_dir", load)

    async def body(repository: ModelRepository) -> None:
        make_version(tmp_path, "m", 2, seed=1)
        assert actions(await repository.reconcile()) == [(2, "loaded"), (1, "unloaded")]
        assert repository.get().version == 2
        assert actions(await repository.reconcile()) == [(3, "loaded"), (2, "unloaded")]

    run(tmp_path, body)


def test_unloading_a_version_loads_nothing_published_since_the_last_scan(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)

    async def body(repository: ModelRepository) -> None:
        make_version(tmp_path, "m", 2, seed=1)  # not scanned yet
        _, events = await repository.unload_model("m", 1)
        assert events == [ReloadEvent("m", 1, "unloaded")]
        assert ready_versions(repository, "m") == []
        assert actions(await repository.reconcile()) == [(2, "loaded")]  # the next scan

    run(tmp_path, body)


def test_a_version_unloaded_by_hand_stops_serving_at_once_even_while_another_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_version(tmp_path, "m", 1)
    held = HeldLoad(monkeypatch, 2)

    async def body(repository: ModelRepository) -> None:
        make_version(tmp_path, "m", 2, seed=1)
        reconcile = asyncio.create_task(repository.reconcile())
        try:
            await held.wait_entered()
            unload = asyncio.create_task(repository.unload_model("m", 1))
            await yield_until(lambda: not ready_versions(repository, "m"))
            # A version loading in its place keeps serving the old one, not one unloaded by hand.
            assert ready_versions(repository, "m") == []
            with pytest.raises(NotReadyError, match="no ready version"):
                repository.get()
        finally:
            held.release()
        assert actions(await reconcile) == [(2, "loaded")]
        assert actions((await unload)[1]) == [(1, "unloaded")]
        assert ready_versions(repository, "m") == [2]

    run(tmp_path, body)


def test_load_model_retries_refused_versions_and_fails_when_none_loads(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)
    break_checksum(make_version(tmp_path, "m", 2))

    async def body(repository: ModelRepository) -> None:
        _, events = await repository.load_model("m")  # the policy again, 2 retried
        assert actions(events) == [(2, "refused")]
        assert repository.get().version == 1  # the serving version stays, untouched
        await repository.unload_model("m")
        break_checksum(tmp_path / "m" / "1")
        message = "model 'm' has no version that loads; m [versions 1 (failed), 2 (failed)]"
        with pytest.raises(LoadFailedError) as raised:
            await repository.load_model("m")
        assert str(raised.value) == message

    metrics = run(tmp_path, body)
    # 2 at startup, 2 retried, then 2 and 1 when nothing loads
    assert failures(metrics, "checksum_mismatch") == 4


def test_an_unloaded_version_is_unpinned_and_unload_model_returns_once_drained(
    tmp_path: Path,
) -> None:
    make_version(tmp_path, "m", 1)
    make_version(tmp_path, "m", 2)

    async def body(repository: ModelRepository) -> None:
        await repository.load_model("m", 1)  # pinned beside the policy's 2
        assert ready_versions(repository, "m") == [1, 2]
        await repository.unload_model("m", 1)
        await repository.load_model("m")  # the policy again: the unload also unpinned 1
        assert ready_versions(repository, "m") == [2]
        record, _ = await repository.unload_model("m")
        # Returned once released: no version left draining, none holding a session.
        assert record.describe() == "m [versions 1 (available), 2 (available)]"
        assert repository.handles() == []

    run(tmp_path, body)


def test_unloading_one_model_does_not_wait_for_another_models_drain(tmp_path: Path) -> None:
    make_version(tmp_path, "a", 1)
    make_version(tmp_path, "b", 1)

    async def body(repository: ModelRepository) -> None:
        gate = threading.Event()
        old = repository.get("a")
        # Hold a's only inference thread: a request on a:1 keeps its drain waiting.
        blocker = old.batcher._executor.submit(gate.wait, 60)
        request = asyncio.create_task(old.classify(["a good film"]))
        try:
            await asyncio.sleep(0)  # the request starts: counted on a:1
            make_version(tmp_path, "a", 2, seed=1)
            await repository.reconcile(["a"])  # a:1 retired, draining behind the request
            unload = asyncio.create_task(repository.unload_model("b"))
            deadline = time.monotonic() + 30  # a guard against a hang, not a timing
            b = repository.models["b"]
            while b.versions[1].state is not State.AVAILABLE:
                assert time.monotonic() < deadline, b.describe()
                await asyncio.sleep(0.005)
            await yield_until(unload.done)
            assert unload.done() and not request.done()  # b is released, a still drains
        finally:
            gate.set()
        await request
        await unload
        assert blocker.done()

    run(tmp_path, body)


# -- what clients and the server are told ------------------------------------------------------


def test_get_names_the_state_and_reason_of_a_version_that_does_not_serve(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)
    make_version(tmp_path, "m", 2)
    break_checksum(make_version(tmp_path, "m", 3))
    # startup's loads not done: retryable, not NOT_FOUND
    with pytest.raises(NotReadyError) as raised:
        ModelRepository.from_server(repository_config(tmp_path)).get()
    assert str(raised.value) == "the server is starting: its models are loading; retry shortly"

    async def body(repository: ModelRepository) -> None:
        assert repository.get("m", 2) is repository.get()  # a READY version by number
        listing = "m [versions 1 (available), 2 (ready), 3 (failed)]"
        with pytest.raises(NotReadyError) as raised:
            repository.get("m", 1)
        assert str(raised.value) == f"model 'm' version 1 is available; {listing}"
        reason = repository.models["m"].versions[3].reason
        assert "does not match the manifest" in reason
        with pytest.raises(NotReadyError) as raised:
            repository.get("m", 3)
        assert str(raised.value) == f"model 'm' version 3 is failed: {reason}; {listing}"

    run(tmp_path, body)


def test_on_change_is_told_whether_any_model_is_served(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)
    told: list[bool] = []

    async def tell(serving: bool) -> None:
        told.append(serving)

    async def body(repository: ModelRepository) -> None:
        assert repository.serving() is True
        repository.on_change = tell
        await repository.unload_model("m")
        assert repository.serving() is False
        await repository.load_model("m")
        assert told == [False, True]

    run(tmp_path, body)


def test_a_model_directory_that_cannot_be_listed_at_startup_is_reported_and_others_serve(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_version(tmp_path, "m", 1)
    (tmp_path / "loop").symlink_to("loop")  # listing it fails (ELOOP), even for root

    async def body(repository: ModelRepository) -> None:
        assert repository.get().name == "m"
        assert ready_models(repository) == ["m"]

    run(tmp_path, body)
    assert "cannot list model 'loop' in" in caplog.text
