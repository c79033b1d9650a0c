"""One mapping of a version's state to the API's (service/servicers/convert.py): ListModels,
GetModel and the Admin RPCs answer the same state for every State a version can be in."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from textserve.service.repository.core import ModelRecord, State, VersionRecord
from textserve.service.servicers.admin import AdminServicer
from textserve.service.servicers.classifier import ClassifierServicer
from textserve.service.servicers.convert import STATES, version_statuses
from textserve.v1 import admin_pb2
from textserve.v1 import classifier_pb2 as pb


class FakeRepository:
    """What ListModels and ReloadRepository read of a repository: its records."""

    def __init__(self, records: list[ModelRecord]) -> None:
        self.models = {r.name: r for r in records}
        self.default_model = records[0].name

    async def reconcile(self) -> list[Any]:
        return []


class FakeContext:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


def every_state() -> list[ModelRecord]:
    states = list(State)
    return [
        ModelRecord(
            "all",
            {
                i + 1: VersionRecord(i + 1, Path(str(i + 1)), state=s, reason=f"r{i}")
                for i, s in enumerate(states)
            },
        ),
        ModelRecord("none"),
    ]


def test_every_state_has_the_api_state_of_its_name() -> None:
    assert set(STATES) == set(State)
    for state, value in STATES.items():
        assert pb.ModelState.Name(value) == f"MODEL_STATE_{state.name}"


def _context(repository: Any) -> Any:
    """A serving context of `repository` alone (what ListModels reads)."""
    from textserve.service.config import ServerConfig
    from textserve.service.dataplane.context import ServingContext

    return ServingContext(ServerConfig(), repository, None)  # type: ignore[arg-type]


def test_list_models_and_admin_answer_the_same_states() -> None:
    repository: Any = FakeRepository(every_state())
    listed = asyncio.run(
        ClassifierServicer(_context(repository)).ListModels(pb.ListModelsRequest(), FakeContext())
    )
    reloaded = asyncio.run(
        AdminServicer(repository).ReloadRepository(
            admin_pb2.ReloadRepositoryRequest(), FakeContext()
        )
    )
    assert list(listed.models) == list(reloaded.models)
    first = listed.models[0]
    assert [v.state for v in first.versions] == [STATES[s] for s in State]
    assert [v.reason for v in first.versions] == [f"r{i}" for i in range(len(State))]
    ready = [s for s in State].index(State.READY) + 1
    assert first.ready_version == ready and first.is_default
    assert listed.models[1].ready_version == 0 and not listed.models[1].is_default
    assert list(version_statuses(repository.models["all"].versions.values())) == list(
        first.versions
    )
