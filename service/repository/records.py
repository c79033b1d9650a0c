"""What the repository knows of each model and version: records, states and legal transitions.

A version's state changes only through VersionRecord's methods, each of which names the states
it may leave from and refuses any other (IllegalTransition), so the life of a version reads in
one place:

    AVAILABLE --start_loading--> LOADING --loaded--> READY --retire--> UNLOADING --released--+
        ^  ^                        |  \\--refuse--> FAILED --retry--+                       |
        |  +----abandon_load--------+                                |                       |
        +------------------------------------------------------------+-----------------------+
    (closed: READY or UNLOADING -> AVAILABLE at shutdown)

Pure: no I/O, no asyncio; the repository (core.py) drives them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from textserve.service.repository.loader import Files
from textserve.service.repository.policy import LATEST, VersionPolicy

if TYPE_CHECKING:
    from textserve.service.engine.cache import ResponseCache
    from textserve.service.engine.handle import ModelHandle
    from textserve.service.engine.window_options import Windows


class State(enum.Enum):
    AVAILABLE = "available"  # on disk, not loaded (the policy does not serve it)
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"  # retired: finishing the requests that picked it, then released
    FAILED = "failed"


class IllegalTransition(RuntimeError):
    """A state change the life of a version does not have: a bug in the repository."""


@dataclass
class VersionRecord:
    version: int
    path: Path
    state: State = State.AVAILABLE
    reason: str = ""  # why FAILED
    handle: ModelHandle | None = None
    on_disk: bool = True
    loaded_files: Files = ()  # fingerprint when loading it was last tried (FAILED or READY)
    changed_files: Files = ()  # READY: the last in-place change warned about

    def _move(self, to: State, *sources: State) -> None:
        if self.state not in sources:
            raise IllegalTransition(
                f"version {self.version}: {self.state.value} -> {to.value} (only from "
                + " or ".join(s.value for s in sources)
                + ")"
            )
        self.state = to

    def start_loading(self) -> None:
        """A load of this version begins."""
        self._move(State.LOADING, State.AVAILABLE)

    def loaded(self, handle: ModelHandle) -> None:
        """The load succeeded: `handle` serves it from now on."""
        self._move(State.READY, State.LOADING)
        self.handle, self.reason = handle, ""

    def refuse(self, reason: str) -> None:
        """The load failed for a reason of this version's (tried again once its files change)."""
        self._move(State.FAILED, State.LOADING)
        self.reason = reason

    def abandon_load(self) -> None:
        """The load ended without a verdict on the version (cancelled, or a configuration error
        such as a missing device): it may be loaded again."""
        self._move(State.AVAILABLE, State.LOADING)

    def retry(self) -> None:
        """A refused version may be tried again (its files changed, or asked for by hand)."""
        self._move(State.AVAILABLE, State.FAILED)
        self.reason = ""

    def retire(self) -> None:
        """No new requests; the ones that picked it finish, then `released`."""
        self._move(State.UNLOADING, State.READY)

    def released(self) -> None:
        """Drained: its session is let go."""
        self._move(State.AVAILABLE, State.UNLOADING)
        self.handle = None

    def closed(self) -> None:
        """Shutdown: its session is closed whatever it was doing."""
        self._move(State.AVAILABLE, State.READY, State.UNLOADING)
        self.handle = None


@dataclass
class ModelRecord:
    name: str
    versions: dict[int, VersionRecord] = field(default_factory=dict)
    policy: VersionPolicy = LATEST  # in force: --version-policy NAME=, serving.json, default
    pinned: set[int] = field(default_factory=set)  # LoadModel(version): served beside the policy
    excluded: set[int] = field(default_factory=set)  # UnloadModel(version): the policy skips them
    disabled: bool = False  # UnloadModel(name): only pinned versions serve until LoadModel(name)
    policy_problem: str = ""  # the last serving.json error, logged once
    cache: ResponseCache | None = None  # the response cache its versions share (caches.py)
    windows: Windows | None = None  # serving.json's default for long texts (None: cut them)

    def ready(self) -> list[VersionRecord]:
        """READY versions, newest first."""
        return sorted(
            (v for v in self.versions.values() if v.state is State.READY),
            key=lambda v: v.version,
            reverse=True,
        )

    def newest_ready(self) -> VersionRecord | None:
        """The newest READY version (the request path's: one pass, no sort), or None."""
        newest = None
        for v in self.versions.values():
            if v.state is State.READY and (newest is None or v.version > newest.version):
                newest = v
        return newest

    def describe(self) -> str:
        parts = [
            f"{v.version} ({v.state.value})"
            for v in sorted(self.versions.values(), key=lambda v: v.version)
        ]
        return f"{self.name} [versions {', '.join(parts) or 'none'}]"

    def wanted(self) -> list[int]:
        """The versions to serve now, newest first: the policy's choice among the versions on
        disk that were not refused or unloaded by hand, plus the pinned ones."""
        candidates = [
            v.version
            for v in self.versions.values()
            if v.on_disk and v.state is not State.FAILED and v.version not in self.excluded
        ]
        chosen = set() if self.disabled else set(self.policy.select(candidates))
        chosen |= self.pinned & set(candidates)
        return sorted(chosen, reverse=True)

    def retry_failed(self) -> None:
        """Every refused version may be tried again (LoadModel(name))."""
        for entry in self.versions.values():
            if entry.state is State.FAILED:
                entry.retry()


@dataclass(frozen=True)
class ReloadEvent:
    model: str
    version: int
    action: str  # loaded | unloaded | refused
    reason: str = ""  # refused: why
