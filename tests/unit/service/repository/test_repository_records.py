"""The life of a version: every transition of records.VersionRecord from every state, legal
ones as the repository uses them, every other one refused (pure, no model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from textserve.service.repository.records import (
    IllegalTransition,
    ModelRecord,
    State,
    VersionRecord,
)

A, L, R, U, F = State.AVAILABLE, State.LOADING, State.READY, State.UNLOADING, State.FAILED
HANDLE: Any = object()  # a stand-in: records never call their handle
# method -> (the states it may leave, as its refusal lists them; the state it enters; its arguments)
LEGAL: dict[str, tuple[tuple[State, ...], State, tuple[Any, ...]]] = {
    "start_loading": ((A,), L, ()),
    "loaded": ((L,), R, (HANDLE,)),
    "refuse": ((L,), F, ("checksum mismatch",)),
    "abandon_load": ((L,), A, ()),
    "retry": ((F,), A, ()),
    "retire": ((R,), U, ()),
    "released": ((U,), A, ()),
    "closed": ((R, U), A, ()),
}


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("method", list(LEGAL))
def test_each_transition_leaves_only_its_source_states(method: str, state: State) -> None:
    sources, target, args = LEGAL[method]
    entry = VersionRecord(3, Path("models/m/3"), state=state, reason="old", handle=HANDLE)
    if state in sources:
        getattr(entry, method)(*args)
        assert entry.state is target
    else:
        with pytest.raises(IllegalTransition) as refused:
            getattr(entry, method)(*args)
        only = " or ".join(s.value for s in sources)
        expected = f"version 3: {state.value} -> {target.value} (only from {only})"
        assert str(refused.value) == expected
        assert entry.state is state and entry.reason == "old"  # nothing changed


def test_what_each_transition_keeps_and_clears() -> None:
    entry = VersionRecord(1, Path("models/m/1"))
    entry.start_loading()
    entry.refuse("bad manifest")
    assert (entry.state, entry.reason) == (F, "bad manifest")
    entry.retry()
    assert (entry.state, entry.reason) == (A, "")
    entry.start_loading()
    entry.loaded(HANDLE)
    assert (entry.state, entry.handle, entry.reason) == (R, HANDLE, "")
    entry.retire()
    assert entry.handle is HANDLE  # still finishing the requests that picked it
    entry.released()
    assert (entry.state, entry.handle) == (A, None)


def test_a_model_retries_its_refused_versions_only() -> None:
    record = ModelRecord("m")
    for version, state in enumerate((F, R, F, A), start=1):
        record.versions[version] = VersionRecord(version, Path(f"m/{version}"), state=state)
    record.retry_failed()
    assert [v.state for v in record.versions.values()] == [A, R, A, A]


def test_no_state_is_assigned_outside_the_records() -> None:
    # The repository changes states only through the methods above (12 assignments once).
    # The module's own file, not a checkout path: `make mutate` stages the package as the wheel
    # lays it out (textserve/service/…), where a top-level service/ does not exist.
    from textserve.service.repository import core as module

    source = Path(module.__file__ or "").read_text()
    assert ".state =" not in source and ".state, " not in source


def test_serving_json_is_read_off_the_event_loop(tmp_path: Path, monkeypatch: Any) -> None:
    """A serving.json on a hung mount: requests keep getting the serving version meanwhile."""
    import asyncio
    import threading

    from tests.handmade import make_version
    from tests.serving import run_repository
    from textserve.service.repository import core

    make_version(tmp_path, "m", 1)
    real = core.read_serving_file
    hung, release, released = threading.Event(), threading.Event(), []

    def read(model_dir: Path) -> Any:
        if hung.is_set():
            # On the loop this would wait out its 5 s: nothing could set `release`.
            released.append(release.wait(5))
        return real(model_dir)

    monkeypatch.setattr(core, "read_serving_file", read)

    async def body(repository: core.ModelRepository) -> None:
        hung.set()
        reconcile = asyncio.create_task(repository.reconcile())
        await asyncio.sleep(0.2)
        assert repository.get("m").version == 1
        release.set()
        await reconcile

    run_repository(tmp_path, body)
    assert released == [True]
