"""The messages supervisor and workers exchange over a worker's pipe: frozen dataclasses,
pickled by multiprocessing, dispatched with `match` on their type (never on a tuple's first
element).

    worker -> supervisor                         supervisor -> worker
    Warm()              models loaded and warm   Serve()          every worker is warm
    Readiness(state)    its /readyz state        Apply(key, change)  an admin change to apply
    StartupFailed(msg)  startup failed: msg      Relayed(ident, error)  the others applied ident
    Relay(ident, change)  an admin call changed this worker: apply it on every other one
    Applied(key, error)   done (error: None or what went wrong)
    Pong(seq)           the answer to Ping(seq)  Ping(seq)        liveness: answered from the
                                                                  worker's event loop
                                                 PeerLost()       another worker died

Admin changes (LoadModel, UnloadModel, ReloadRepository) are relayed rather than shared
through a file: the call returns only once every worker has applied it, errors come back to
the caller, and the supervisor keeps the list to replay to a worker it restarts.

This module imports nothing of the server: the servicers (the admin relay), the server (the
Coordinator it is built with) and both processes share it.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from textserve.service.repository.core import ModelRepository


Hook = Callable[[], None]  # what a worker's server is told to do (attach: stop, peer_lost)


class AdminAction(enum.Enum):
    """What an admin call changed on the worker it landed on."""

    LOAD = "load"  # LoadModel(name, version)
    UNLOAD = "unload"  # UnloadModel(name, version)
    RELOAD = "reload"  # ReloadRepository(): a rescan, nothing to replay to a new worker


@dataclass(frozen=True)
class AdminChange:
    action: AdminAction
    model: str = ""  # "" for RELOAD
    version: int | None = None  # None: the version policy's choice

    @property
    def replayed(self) -> bool:
        """Whether a worker that starts later must apply it too (a rescan it does anyway)."""
        return self.action is not AdminAction.RELOAD


@dataclass(frozen=True)
class RelayKey:
    """Which relayed change an Apply/Applied is about: the worker it came from, its number."""

    worker: int
    ident: int


# -- worker -> supervisor -----------------------------------------------------------------------


@dataclass(frozen=True)
class Warm:
    """Models loaded and warm; the worker waits for Serve."""


@dataclass(frozen=True)
class Readiness:
    state: str  # one of the readiness states /readyz reports (textserve.service.metrics)


@dataclass(frozen=True)
class StartupFailed:
    message: str  # one line for the user: the worker exits with status 2 next


@dataclass(frozen=True)
class Relay:
    ident: int  # the worker's own number for it, echoed back in Relayed
    change: AdminChange


@dataclass(frozen=True)
class Applied:
    key: RelayKey
    error: str | None


@dataclass(frozen=True)
class Pong:
    seq: int


# -- supervisor -> worker -----------------------------------------------------------------------


@dataclass(frozen=True)
class Serve:
    """Every worker is warm: report SERVING."""


@dataclass(frozen=True)
class Apply:
    key: RelayKey | None  # None: a catch-up from the log, nobody waits for the answer
    change: AdminChange


@dataclass(frozen=True)
class Relayed:
    ident: int
    error: str | None  # None when every other worker applied it


@dataclass(frozen=True)
class Ping:
    seq: int


@dataclass(frozen=True)
class PeerLost:
    """Another worker died: its clients reconnect to the others (service/backlog.py does not
    judge their load overload for a moment)."""


ToSupervisor = Warm | Readiness | StartupFailed | Relay | Applied | Pong
ToWorker = Serve | Apply | Relayed | Ping | PeerLost


class Coordinator(Protocol):
    """What a server built as one worker of `--workers N` is linked to (create_server's
    `coordinator`): the worker's end of the pipe to its supervisor."""

    worker_id: str  # "INDEX/PID": grpc.health.v1 Check answers carry it

    @property
    def workers(self) -> int:
        """N, which they carry too."""

    def attach(self, repository: ModelRepository, stop: Hook, peer_lost: Hook) -> None:
        """Start listening to the supervisor, before the server starts: admin changes of the
        other workers apply to `repository`; `stop()` drains the server (the supervisor is
        gone); `peer_lost()` when another worker died."""

    async def before_serving(self) -> None:
        """Awaited once the models are warm, before SERVING (the supervisor says when every
        worker is warm)."""

    def on_readiness(self, state: str) -> None:
        """Told each readiness state (the supervisor's /readyz follows every worker's)."""

    async def relay(self, change: AdminChange) -> None:
        """Apply an admin change this worker made on every other worker; returns when they
        have (an error naming the worker when one could not)."""


# what the admin servicer is given to relay a change (Coordinator.relay)
RelayChange = Callable[[AdminChange], Awaitable[None]]
