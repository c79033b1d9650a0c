"""The textserve.v1.Admin servicer: LoadModel, UnloadModel, ReloadRepository over the repository.

Registered only when the server runs with --enable-admin (then health and reflection list it);
without it the RPCs answer UNIMPLEMENTED like any unknown service. Errors are the taxonomy of
service/errors.py: NOT_FOUND for an unknown model or version, FAILED_PRECONDITION for a version
that was refused (the message says why), INVALID_ARGUMENT for a request without a model name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from textserve.artifact import shown
from textserve.service.dataplane.prologue import model_name
from textserve.service.errors import ValidationError
from textserve.service.repository.core import ModelRepository, ReloadEvent
from textserve.service.servicers.convert import model_summary
from textserve.service.servicers.status import grpc_errors
from textserve.service.workers.protocol import AdminAction, AdminChange
from textserve.v1 import admin_pb2 as pb
from textserve.v1 import admin_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from textserve.service.dataplane.context import ServingContext

logger = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Admin"].full_name

_ACTIONS = {
    "loaded": pb.VersionEvent.ACTION_LOADED,
    "unloaded": pb.VersionEvent.ACTION_UNLOADED,
    "refused": pb.VersionEvent.ACTION_REFUSED,
}


def version_events(events: Iterable[ReloadEvent]) -> list[pb.VersionEvent]:
    return [
        pb.VersionEvent(
            model=e.model, version=e.version, action=_ACTIONS[e.action], reason=e.reason
        )
        for e in events
    ]


def _target(name: str, version: int) -> tuple[str, int | None]:
    if not name:
        raise ValidationError("name the model (the request's `name` is empty)")
    model_name(name)  # NOT_FOUND for a name too long to be a model's, before it is logged
    if version < 0:
        raise ValidationError(f"version must be 0 (the policy's choice) or positive, got {version}")
    return name, version or None


class AdminServicer(pb_grpc.AdminServicer):
    def __init__(self, repository: ModelRepository, ctx: ServingContext | None = None) -> None:
        self._repository = repository
        self._ctx = ctx

    async def _relay(self, action: AdminAction, name: str = "", version: int | None = None) -> None:
        """With --workers the call landed on one worker: the others apply it too before the
        call returns (the supervisor relays it), so every connection sees the change."""
        relay = self._ctx.relay if self._ctx is not None else None
        if relay is not None:
            await relay(AdminChange(action, name, version))

    @grpc_errors
    async def LoadModel(self, request: pb.LoadModelRequest, context: Any) -> pb.LoadModelResponse:
        name, version = _target(request.name, request.version)
        logger.info(
            "admin LoadModel %s version %s from %s", shown(name), version or "*", context.peer()
        )
        record, events = await self._repository.load_model(name, version)
        await self._relay(AdminAction.LOAD, name, version)
        return pb.LoadModelResponse(
            model=model_summary(record, self._repository.default_model),
            events=version_events(events),
        )

    @grpc_errors
    async def UnloadModel(
        self, request: pb.UnloadModelRequest, context: Any
    ) -> pb.UnloadModelResponse:
        name, version = _target(request.name, request.version)
        logger.info(
            "admin UnloadModel %s version %s from %s", shown(name), version or "*", context.peer()
        )
        record, events = await self._repository.unload_model(name, version)
        await self._relay(AdminAction.UNLOAD, name, version)
        return pb.UnloadModelResponse(
            model=model_summary(record, self._repository.default_model),
            events=version_events(events),
        )

    @grpc_errors
    async def ReloadRepository(
        self, request: pb.ReloadRepositoryRequest, context: Any
    ) -> pb.ReloadRepositoryResponse:
        logger.info("admin ReloadRepository from %s", context.peer())
        events = await self._repository.reconcile()
        await self._relay(AdminAction.RELOAD)
        default = self._repository.default_model
        return pb.ReloadRepositoryResponse(
            events=version_events(events),
            models=[model_summary(r, default) for r in self._repository.models.values()],
        )


def register(server: grpc.aio.Server, ctx: ServingContext) -> Sequence[str]:
    """Add the Admin service when the config enables it; returns the names it added."""
    if not ctx.config.enable_admin:
        return []
    pb_grpc.add_AdminServicer_to_server(AdminServicer(ctx.repository, ctx), server)
    return [SERVICE_NAME]
