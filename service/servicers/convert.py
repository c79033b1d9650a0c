"""The repository's records as textserve.v1 messages, built once for every servicer.

    summary = model_summary(record, repository.default_model)   # ListModels, Admin responses
    versions = version_statuses(record.versions.values())       # GetModel's `versions`

ListModels, GetModel and the Admin RPCs all answer with these, so a version's state reads the
same whichever RPC (or HTTP route) reports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from textserve.service.repository.core import State
from textserve.v1 import classifier_pb2 as pb

if TYPE_CHECKING:
    from textserve.service.repository.core import ModelRecord, VersionRecord

# The one mapping of a version's state to the API's; every State has its MODEL_STATE_ twin.
STATES: dict[State, pb.ModelState] = {
    State.AVAILABLE: pb.MODEL_STATE_AVAILABLE,
    State.LOADING: pb.MODEL_STATE_LOADING,
    State.READY: pb.MODEL_STATE_READY,
    State.UNLOADING: pb.MODEL_STATE_UNLOADING,
    State.FAILED: pb.MODEL_STATE_FAILED,
}


def version_statuses(records: Iterable[VersionRecord]) -> list[pb.VersionStatus]:
    """Each version's number, state and reason, in ascending version order."""
    return [
        pb.VersionStatus(version=v.version, state=STATES[v.state], reason=v.reason)
        for v in sorted(records, key=lambda v: v.version)
    ]


def model_summary(record: ModelRecord, default_model: str | None) -> pb.ModelSummary:
    """A model's versions, the version a request without one gets, and whether it is the
    default model."""
    ready = record.ready()
    return pb.ModelSummary(
        name=record.name,
        versions=version_statuses(record.versions.values()),
        ready_version=ready[0].version if ready else 0,
        is_default=record.name == default_model,
    )
