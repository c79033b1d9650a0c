"""The model repository: scan models/<name>/<version>/, apply version policies, hot-reload.

Each model keeps a record per version found on disk (service/repository/records.py: the
states and the only legal transitions between them). `reconcile` makes the served versions
match the policy (service/repository/policy.py): wanted versions are loaded, checked and warmed
beside those serving (service/repository/loader.py, through the `load` function the repository
is given), and only once READY does `get` hand them out (it always picks the newest READY
version, in one event-loop step, so the switch is atomic); versions no longer wanted are
retired: no new requests, the ones that already picked them finish there, then the session is
released (ModelHandle.drain). A refused version is FAILED with its reason (logged, counted,
shown by GetModel) and the policy falls back to the next one, so the version that was serving
keeps serving. `load_all` is the first reconcile (at startup; StartupError when nothing can
serve); a RepositoryWatcher repeats it every `poll_interval` seconds; the admin service calls
`load_model` / `unload_model` / `reconcile`. Everything that touches the disk (the scan,
serving.json, fingerprints, loads) runs on worker threads: a slow or hung mount must not stall
serving.

    repository = ModelRepository.from_server(server_config, metrics)
    await repository.load_all()
    handle = repository.get("tiny")          # the newest READY version
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from textserve.service.engine.memory import release_freed_memory
from textserve.service.errors import LoadFailedError, ModelNotFoundError, NotReadyError
from textserve.service.repository import caches
from textserve.service.repository.config import RepositoryConfig
from textserve.service.repository.loader import LoadError, fingerprint, load_version_dir
from textserve.service.repository.policy import PolicyError, ServingFile, read_serving_file
from textserve.service.repository.records import ModelRecord, ReloadEvent, State, VersionRecord
from textserve.service.repository.scan import ScanLog, ScanResult, scan, scan_repository
from textserve.service.repository.watcher import RepositoryWatcher

if TYPE_CHECKING:
    from textserve.service.config import ServerConfig
    from textserve.service.engine.handle import ModelHandle
    from textserve.service.metrics import Metrics

__all__ = [
    "LoadError",
    "ModelRecord",
    "ModelRepository",
    "ReloadEvent",
    "RepositoryConfig",
    "StartupError",
    "State",
    "VersionRecord",
    "scan",
]

logger = logging.getLogger(__name__)

# Loads one version directory into a warm, not yet started handle; LoadError if it cannot serve.
Loader = Callable[[Path], "ModelHandle"]


class StartupError(Exception):
    """The repository cannot start serving (no repository, no version that loads, the named
    default model missing or refused, a bad serving.json): the server exits with this message.
    A refused version alone is no startup error while another one serves."""


class ModelRepository:
    """Every model of one repository directory and the handles serving them. Use on one loop."""

    def __init__(
        self, config: RepositoryConfig, load: Loader, metrics: Metrics | None = None
    ) -> None:
        self.config = config
        self.root = config.root
        self._load_version = load
        self.metrics = metrics
        self.models: dict[str, ModelRecord] = {}
        self.default_model: str | None = None
        # One decision at a time (watcher, admin RPCs): scan, pick versions, start loads, retire.
        # Held only for quick steps: the long work (reading, hashing, loading a version) runs in
        # tasks outside it, so an admin call or another model never waits behind a slow load.
        self._lock = asyncio.Lock()
        # The load in flight per model (one at a time per model, so its versions are tried in
        # the policy's order; different models load side by side).
        self._loads: dict[str, tuple[int, asyncio.Task[bool]]] = {}
        self._drains: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._scan_log = ScanLog(self.root, logger)  # what was skipped, said once
        # Each model's serving.json as last read (off the event loop, with the scan), or why
        # it could not be used.
        self._policy_files: dict[str, ServingFile | PolicyError] = {}
        self._started = False
        self._watcher: RepositoryWatcher | None = None
        # Told, after every change that loaded or unloaded a version, whether any model is
        # being served (the server turns health NOT_SERVING while none is).
        self.on_change: Callable[[bool], Awaitable[None]] | None = None

    @classmethod
    def from_server(cls, config: ServerConfig, metrics: Metrics | None = None) -> ModelRepository:
        """The repository of a server: its settings, and versions loaded as `config` says."""

        def load(path: Path) -> ModelHandle:
            return load_version_dir(path, config, metrics=metrics)

        return cls(RepositoryConfig.of(config), load, metrics)

    # -- startup -------------------------------------------------------------------------------

    async def load_all(self) -> None:
        """Startup: scan, load what the policies pick and start watching; raise StartupError if
        nothing (or the named default model) could be served."""
        if not await asyncio.to_thread(self.root.is_dir):
            raise StartupError(f"model repository {self.root} is not a directory")
        found = await asyncio.to_thread(scan, self.root)
        if not found:
            raise StartupError(
                f"no model versions in {self.root} (expected {self.root}/<name>/<version>/"
                "manifest.json; export one with `textserve export`)"
            )
        wanted = self.config.default_model
        if wanted is not None and wanted not in found:
            raise StartupError(
                f"--model {wanted!r} is not in {self.root}; it has {', '.join(found)}"
            )
        await self.reconcile()
        if wanted is not None:
            if not self.models[wanted].ready():
                record = self.models[wanted]
                raise StartupError(
                    f"default model {record.describe()} did not load (version policy "
                    f"{record.policy})"
                )
            self.default_model = wanted
        elif len(self.models) == 1:
            self.default_model = next(iter(self.models))
        if not any(m.ready() for m in self.models.values()):
            raise StartupError(
                "no model version could be loaded: "
                + "; ".join(
                    f"{m.name} {v.version}: {v.reason}"
                    for m in self.models.values()
                    for v in m.versions.values()
                    if v.state is State.FAILED
                )
            )
        self._started = True
        if self.config.poll_interval > 0:
            self._watcher = RepositoryWatcher(self.reconcile, self.config.poll_interval)
            self._watcher.start()

    # -- reconciling ---------------------------------------------------------------------------

    async def reconcile(self, names: Iterable[str] | None = None) -> list[ReloadEvent]:
        """Scan the repository and make the served versions of `names` (None: every model)
        match their policies. Returns what changed. Retired versions drain in the background."""
        return await self._converge(None if names is None else set(names), rescan=True)

    async def _converge(self, names: set[str] | None, *, rescan: bool) -> list[ReloadEvent]:
        """Rounds of: decide under the lock (scan first, once), then wait for the loads started
        (or already in flight) without it; until nothing is left to load. A refused version
        leaves the candidates, so the next round lets the policy pick again."""
        events: list[ReloadEvent] = []
        first = True
        while True:
            async with self._lock:
                if rescan and first:
                    await self._rescan()
                first = False
                started, waiting = self._decide(names, events)
            if not waiting:
                break
            # Not return_exceptions: a cancellation or a configuration error at startup
            # (DeviceUnavailableError) ends the reconcile, as it did when loads ran inline.
            await asyncio.gather(*waiting)
            for record, entry, load in started:
                ok = load.result()
                events.append(
                    ReloadEvent(record.name, entry.version, "loaded" if ok else "refused",
                                entry.reason)
                )  # fmt: skip
        if events and self.on_change is not None:
            await self.on_change(self.serving())
        return events

    def _decide(
        self, names: set[str] | None, events: list[ReloadEvent]
    ) -> tuple[
        list[tuple[ModelRecord, VersionRecord, asyncio.Task[bool]]], list[asyncio.Task[bool]]
    ]:
        """One step, no waiting: per model, start loading the newest wanted version not loaded
        yet, or (nothing to load) retire what is no longer wanted. Returns the loads started
        and every load of these models to wait for."""
        started: list[tuple[ModelRecord, VersionRecord, asyncio.Task[bool]]] = []
        waiting: list[asyncio.Task[bool]] = []
        for record in list(self.models.values()):
            if names is not None and record.name not in names:
                continue
            self._refresh_policy(record)
            if record.name not in self._loads:
                missing = [
                    v for v in record.wanted() if record.versions[v].state is State.AVAILABLE
                ]
                if missing:
                    entry = record.versions[missing[0]]
                    started.append((record, entry, self._start_load(record, entry)))
            in_flight = self._loads.get(record.name)
            if in_flight is not None:
                waiting.append(in_flight[1])
            keep = set(record.wanted())
            for entry in record.ready():
                # While a load is in flight the version it replaces keeps serving, unless it
                # was unloaded by hand.
                by_hand = record.disabled or entry.version in record.excluded
                if entry.version not in keep and (in_flight is None or by_hand):
                    self._retire(record, entry)
                    events.append(ReloadEvent(record.name, entry.version, "unloaded"))
            self._forget_removed(record)
        return started, waiting

    def serving(self) -> bool:
        """Whether any model has a version that takes requests."""
        return any(record.ready() for record in self.models.values())

    async def _rescan(self) -> None:
        """Scan the repository into the records. The files of refused and served versions are
        watched for changes; like the scan, reading them stays off the event loop (a slow or
        hung mount must not stall serving)."""
        watched = [
            entry.path
            for record in self.models.values()
            for entry in record.versions.values()
            if entry.state in (State.FAILED, State.READY)
        ]
        known = list(self.models)  # read here: the loop changes self.models, not the thread
        result, policies = await asyncio.to_thread(self._read_disk, watched, known)
        self._scan_log.report(result)
        self._update_records(result)
        self._policy_files = policies

    def _read_disk(
        self, watched: list[Path], known: list[str]
    ) -> tuple[ScanResult, dict[str, ServingFile | PolicyError]]:
        """On a worker thread: the scan, and the serving.json of every model found or known."""
        result = scan_repository(self.root, watched)
        policies: dict[str, ServingFile | PolicyError] = {}
        for name in {*result.found, *known}:
            try:
                policies[name] = read_serving_file(self.root / name)
            except PolicyError as exc:
                policies[name] = exc
        return result, policies

    def _update_records(self, result: ScanResult) -> None:
        found, files = result.found, result.files
        for name, versions in found.items():
            record = self.models.setdefault(name, ModelRecord(name))
            for version, path in versions.items():
                entry = record.versions.setdefault(version, VersionRecord(version, path))
                now = files.get(path)  # (on_disk is set for every listed model below)
                if now is None or now == entry.loaded_files:
                    continue
                if entry.state is State.FAILED:
                    logger.info(
                        "model %s version %d changed on disk: trying it again", name, version
                    )
                    entry.retry()
                elif entry.state is State.READY and now and now != entry.changed_files:
                    # Versions are immutable (an export publishes a new one): files of a served
                    # version rewritten in place are not reloaded, the copy verified at load
                    # keeps serving. Said once per change: a silent mismatch is worse.
                    entry.changed_files = now
                    logger.warning(
                        "model %s version %d: its files changed on disk since it was loaded; "
                        "still serving the copy verified at load. Versions are immutable: "
                        "publish the change as a new version (textserve export), which is "
                        "picked up and verified",
                        name, version,
                    )  # fmt: skip
        for name, record in self.models.items():
            if name in result.unreadable:
                continue  # not listed this time: nothing is known to have left
            on_disk = found.get(name, {})
            for entry in record.versions.values():
                entry.on_disk = entry.version in on_disk

    def _refresh_policy(self, record: ModelRecord) -> None:
        """The policy in force from the flags and the serving.json read with the last scan."""
        from_file = self._policy_files.get(record.name)
        if isinstance(from_file, PolicyError):
            exc = from_file
            if not self._started:
                raise StartupError(str(exc)) from None
            if str(exc) != record.policy_problem:
                logger.error("%s; keeping version policy %s", exc, record.policy)
            record.policy_problem = str(exc)
            return
        record.policy_problem = ""
        record.windows = None if from_file is None else from_file.windows
        size = caches.wanted_size(self.config.cache_size, from_file)
        caches.apply_size(record, size, self.metrics)
        policy = self.config.version_policy.for_model(
            record.name, None if from_file is None else from_file.version_policy
        )
        if policy != record.policy:
            if self._started:
                logger.info("model %s: version policy %s -> %s", record.name, record.policy, policy)
            record.policy = policy

    def _forget_removed(self, record: ModelRecord) -> None:
        """Drop versions that left the disk and hold nothing; drop a model with none left."""
        for version, entry in list(record.versions.items()):
            if not entry.on_disk and entry.handle is None and entry.state is not State.LOADING:
                del record.versions[version]
        if not record.versions and self._started and self.models.get(record.name) is record:
            logger.info("model %s is gone from %s", record.name, self.root)
            del self.models[record.name]
            if self.metrics is not None:
                self.metrics.clear_model_info(record.name)

    def _start_load(self, record: ModelRecord, entry: VersionRecord) -> asyncio.Task[bool]:
        entry.start_loading()
        task = asyncio.get_running_loop().create_task(
            self._load(record, entry), name=f"load-{record.name}:{entry.version}"
        )
        self._loads[record.name] = (entry.version, task)

        def ended(done: asyncio.Task[bool]) -> None:
            # Cancelled before its first step (the reconcile waiting for it was cancelled in the
            # step that started it): _load never ran, nor its cleanup. Left in _loads, the model
            # would stay LOADING and every later wait for it raise CancelledError.
            if self._loads.get(record.name, (None, None))[1] is done:
                del self._loads[record.name]
                entry.abandon_load()

        task.add_done_callback(ended)
        return task

    async def _load(self, record: ModelRecord, entry: VersionRecord) -> bool:
        """Load, verify and warm one version, then start serving it. False (state FAILED,
        reason logged and counted) if it cannot be served. Runs as a task, outside the lock."""
        from textserve.service.engine.runtime import DeviceUnavailableError

        name, version = record.name, entry.version
        try:
            # Taken before loading: files that change during the load differ at the next scan.
            entry.loaded_files = await asyncio.to_thread(fingerprint, entry.path)
            entry.changed_files = ()
            handle = await asyncio.to_thread(self._load_blocking, entry.path)
            caches.attach(record, handle)
            handle.start()
        except LoadError as exc:
            self._refuse(record, entry, str(exc), exc.reason)
            return False
        except DeviceUnavailableError:
            entry.abandon_load()  # at startup: the configuration's error, not this one's
            raise
        except Exception as exc:
            # A check nobody foresaw failed: still this version's problem, never the server's.
            logger.debug("loading model %s version %d", name, version, exc_info=True)
            self._refuse(record, entry, f"unexpected {type(exc).__name__}: {exc}", "other")
            return False
        except BaseException:
            entry.abandon_load()  # cancelled (shutdown) or a configuration error
            raise
        finally:
            if self._loads.get(name, (None,))[0] == version:
                del self._loads[name]
        entry.loaded(handle)
        logger.info(
            "model %s version %d ready on %s (labels %s, max_length %d)",
            name, version, handle.provider, ", ".join(handle.labels), handle.max_length,
        )  # fmt: skip
        if self.metrics is not None:
            self.metrics.init_model(name)
        self._update_info(record)
        return True

    def _load_blocking(self, path: Path) -> ModelHandle:
        from textserve.service.engine.runtime import DeviceUnavailableError

        try:
            return self._load_version(path)
        except DeviceUnavailableError as exc:
            if not self._started:
                raise  # at startup: a configuration error with its own message
            raise LoadError(str(exc), "session_error") from None

    def _refuse(self, record: ModelRecord, entry: VersionRecord, reason: str, label: str) -> None:
        entry.refuse(reason)
        serving = record.ready()
        logger.error(
            "model %s version %d refused (%s): %s%s",
            record.name, entry.version, label, reason,
            f"; version {serving[0].version} keeps serving" if serving else "",
        )  # fmt: skip
        if self.metrics is not None:
            self.metrics.count_load_failure(record.name, label)

    def _retire(self, record: ModelRecord, entry: VersionRecord) -> None:
        """Stop handing `entry` out (same loop step), then drain it in the background."""
        entry.retire()
        caches.retire(entry.handle)
        self._update_info(record)
        key = (record.name, entry.version)
        logger.info("model %s version %d retired; draining", *key)
        self._drains[key] = asyncio.get_running_loop().create_task(
            self._drain(record, entry), name=f"drain-{record.name}:{entry.version}"
        )

    async def _drain(self, record: ModelRecord, entry: VersionRecord) -> None:
        try:
            if entry.handle is not None:
                await entry.handle.drain(self.config.grace_period)
        finally:
            if entry.state is State.UNLOADING:
                entry.released()
            entry.handle = None
            self._drains.pop((record.name, entry.version), None)
            logger.info("model %s version %d unloaded", record.name, entry.version)
            self._forget_removed(record)
        # The retired session's pages back to the system (glibc keeps them otherwise): on a
        # thread of the loop's executor, not awaited, so an unload waits for nothing more.
        asyncio.get_running_loop().run_in_executor(None, release_freed_memory)

    def _update_info(self, record: ModelRecord) -> None:
        """textserve_model_info follows the version `get` hands out: the newest READY."""
        if self.metrics is None:
            return
        ready = record.ready()
        if ready and ready[0].handle is not None:
            handle = ready[0].handle
            self.metrics.set_model_info(
                record.name, handle.version, handle.provider, handle.precision
            )
        else:
            self.metrics.clear_model_info(record.name)

    # -- explicit control (the admin service) --------------------------------------------------

    async def load_model(
        self, name: str, version: int | None = None
    ) -> tuple[ModelRecord, list[ReloadEvent]]:
        """Serve `version` of `name` (kept beside the policy's choice until unloaded), or with
        None serve what the policy picks again, retrying refused versions. LoadFailedError if
        nothing asked for could be served."""
        async with self._lock:
            await self._rescan()
            record = self._record(name)
            if version:
                entry = self._entry(record, version)
                record.excluded.discard(version)
                record.pinned.add(version)
                if entry.state is State.FAILED:
                    entry.retry()  # asked for by hand: try it again
            else:
                record.disabled = False
                record.excluded.clear()
                record.retry_failed()
        events = await self._converge({name}, rescan=False)
        if version and record.versions[version].state is not State.READY:
            record.pinned.discard(version)
            raise LoadFailedError(
                f"model {name!r} version {version} was refused: {record.versions[version].reason}"
            )
        if not version and not record.ready():
            raise LoadFailedError(f"model {name!r} has no version that loads; {record.describe()}")
        return record, events

    async def unload_model(
        self, name: str, version: int | None = None
    ) -> tuple[ModelRecord, list[ReloadEvent]]:
        """Stop serving `version` of `name` (the policy then picks among the others), or with
        None every version of it until load_model(name). Returns once drained."""
        async with self._lock:
            record = self._record(name)
            if version:
                self._entry(record, version)
                record.excluded.add(version)
                record.pinned.discard(version)
            else:
                record.disabled = True
                record.pinned.clear()
        events = await self._converge({name}, rescan=False)
        drains = [
            task
            for (model, v), task in self._drains.items()
            if model == name and (not version or v == version)
        ]
        await asyncio.gather(*drains)
        return record, events

    def _record(self, name: str) -> ModelRecord:
        record = self.models.get(name)
        if record is None:
            raise ModelNotFoundError(f"model {name!r} not found; models: {self._listing()}")
        return record

    def _entry(self, record: ModelRecord, version: int) -> VersionRecord:
        entry = record.versions.get(version)
        if entry is None or not entry.on_disk:
            raise ModelNotFoundError(
                f"model {record.name!r} has no version {version} on disk; {record.describe()}"
            )
        return entry

    # -- lookups -------------------------------------------------------------------------------

    def get(self, name: str | None = None, version: int | None = None) -> ModelHandle:
        """The handle serving `name` (None: the default model) at `version` (None: newest READY)."""
        if not self._started:
            # Startup's loads are under way (a client may reach a port that is bound but not
            # yet SERVING, e.g. a round_robin client on a restarted replica): UNAVAILABLE, which
            # clients retry, not NOT_FOUND for a model that is about to be there.
            raise NotReadyError("the server is starting: its models are loading; retry shortly")
        if not name:
            if self.default_model is None:
                raise ModelNotFoundError(
                    "no model named and this server has no default model; name one of: "
                    + self._listing()
                )
            name = self.default_model
        record = self.models.get(name)
        if record is None:
            raise ModelNotFoundError(f"model {name!r} not found; models: {self._listing()}")
        if version:
            entry = record.versions.get(version)
            if entry is None:
                raise ModelNotFoundError(
                    f"model {name!r} has no version {version}; {record.describe()}"
                )
            if entry.state is not State.READY or entry.handle is None:
                detail = f": {entry.reason}" if entry.reason else ""
                raise NotReadyError(
                    f"model {name!r} version {version} is {entry.state.value}{detail}; "
                    f"{record.describe()}"
                )
            return entry.handle
        newest = record.newest_ready()
        if newest is None or newest.handle is None:
            raise NotReadyError(f"model {name!r} has no ready version; {record.describe()}")
        return newest.handle

    def _listing(self) -> str:
        return ", ".join(m.describe() for m in self.models.values()) or "none"

    def handles(self) -> list[ModelHandle]:
        """Every handle still holding a session: READY and draining ones."""
        return [
            v.handle
            for m in self.models.values()
            for v in m.versions.values()
            if v.handle is not None
        ]

    # -- shutdown ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Drain phase: no more reloads; every batcher runs what is queued without waiting for
        batches to fill."""
        if self._watcher is not None:
            self._watcher.cancel()
        for handle in self.handles():
            handle.flush()

    async def close(self, timeout: float | None = 0.0) -> None:
        if self._watcher is not None:
            await self._watcher.stop()
        loads = [task for _, task in self._loads.values()]
        for load in loads:
            load.cancel()  # the executor thread finishes on its own; its handle is dropped
        await asyncio.gather(*loads, return_exceptions=True)
        handles = self.handles()  # draining ones too: their drain is cut short below
        drains = list(self._drains.values())
        for task in drains:
            task.cancel()
        await asyncio.gather(*drains, return_exceptions=True)
        await asyncio.gather(*(h.close(timeout) for h in handles))
        for record in self.models.values():
            for entry in record.versions.values():
                if entry.handle is not None:
                    entry.closed()
