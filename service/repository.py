"""The model repository: scan models/<name>/<version>/, verify manifests, load and serve versions.

Each model keeps a record per version found on disk with its state. `load_all` loads, per
model, the versions the version policy picks (default: the newest that loads; a refused newer
version is reported FAILED and the next one is tried). Handles are looked up per request with
`get`. Built so that hot reload can be added beside it: `load_version` / `unload_version` work
on single versions while others keep serving, and `get` always picks the newest READY one.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from service.config import ServerConfig
from service.errors import ModelNotFoundError, NotReadyError
from service.manifest import MODEL_FILE, TOKENIZER_FILE, Manifest, ManifestError

if TYPE_CHECKING:
    from service.metrics import Metrics
    from service.model import ModelHandle

logger = logging.getLogger(__name__)


class State(enum.Enum):
    AVAILABLE = "available"  # on disk, not loaded (the policy does not serve it)
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"


@dataclass
class VersionRecord:
    version: int
    path: Path
    state: State = State.AVAILABLE
    reason: str = ""  # why FAILED
    handle: ModelHandle | None = None


@dataclass
class ModelRecord:
    name: str
    versions: dict[int, VersionRecord] = field(default_factory=dict)

    def ready(self) -> list[VersionRecord]:
        """READY versions, newest first."""
        return sorted(
            (v for v in self.versions.values() if v.state is State.READY),
            key=lambda v: v.version,
            reverse=True,
        )

    def describe(self) -> str:
        parts = [
            f"{v.version} ({v.state.value})"
            for v in sorted(self.versions.values(), key=lambda v: v.version)
        ]
        return f"{self.name} [versions {', '.join(parts) or 'none'}]"


# A version policy: given the versions on disk, the ones to try, in order of preference.
# `load_all` serves the first of them that loads.
VersionPolicy = Callable[[Sequence[int]], list[int]]


def newest_first(versions: Sequence[int]) -> list[int]:
    return sorted(versions, reverse=True)


class LoadError(Exception):
    """A version that cannot be served; `reason` is a textserve_model_load_failures_total label."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def scan(root: Path) -> dict[str, dict[int, Path]]:
    """models/<name>/<version>/ directories; a version is a positive integer directory name.

    A version directory without manifest.json is skipped (being written, or not a version).
    """
    found: dict[str, dict[int, Path]] = {}
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        versions: dict[int, Path] = {}
        for version_dir in model_dir.iterdir():
            if not (version_dir.is_dir() and version_dir.name.isdigit()):
                continue
            if int(version_dir.name) < 1 or not (version_dir / "manifest.json").is_file():
                continue
            versions[int(version_dir.name)] = version_dir
        if versions:
            found[model_dir.name] = versions
    return found


class ModelRepository:
    """Every model of one repository directory and the handles serving them."""

    def __init__(
        self,
        config: ServerConfig,
        metrics: Metrics | None = None,
        *,
        policy: VersionPolicy = newest_first,
    ) -> None:
        self.config = config
        self.root = Path(config.repository)
        self.metrics = metrics
        self.policy = policy
        self.models: dict[str, ModelRecord] = {}
        self.default_model: str | None = None
        # One tokenizer thread for every model: tokenizers parallelises inside encode_batch.
        self._tokenize_executor: Executor = ThreadPoolExecutor(1, thread_name_prefix="tokenize")

    # -- loading -------------------------------------------------------------------------------

    async def load_all(self) -> None:
        """Scan and load what the policy picks; raise LoadError if nothing (or the named
        default model) could be served."""
        if not self.root.is_dir():
            raise LoadError(f"model repository {self.root} is not a directory", "other")
        found = scan(self.root)
        if not found:
            raise LoadError(
                f"no model versions in {self.root} (expected {self.root}/<name>/<version>/"
                "manifest.json; export one with `textserve export`)",
                "other",
            )
        wanted = self.config.model
        if wanted is not None and wanted not in found:
            raise LoadError(
                f"--model {wanted!r} is not in {self.root}; it has {', '.join(found)}", "other"
            )
        for name, versions in found.items():
            record = self.models.setdefault(name, ModelRecord(name))
            for version, path in versions.items():
                record.versions.setdefault(version, VersionRecord(version, path))
            for version in self.policy(list(versions)):
                if await self.load_version(name, version):
                    break
        if wanted is not None:
            if not self.models[wanted].ready():
                raise LoadError(
                    f"default model {self.models[wanted].describe()} did not load", "other"
                )
            self.default_model = wanted
        elif len(self.models) == 1:
            self.default_model = next(iter(self.models))
        if not any(m.ready() for m in self.models.values()):
            raise LoadError(
                "no model version could be loaded: "
                + "; ".join(
                    f"{m.name} {v.version}: {v.reason}"
                    for m in self.models.values()
                    for v in m.versions.values()
                    if v.state is State.FAILED
                ),
                "other",
            )

    async def load_version(self, name: str, version: int) -> bool:
        """Load, verify and warm one version, then start serving it. False (state FAILED,
        reason logged and counted) if it cannot be served."""
        record = self.models[name].versions[version]
        record.state = State.LOADING
        loop = asyncio.get_running_loop()
        try:
            handle = await loop.run_in_executor(None, self._load_blocking, record.path)
        except LoadError as exc:
            record.state, record.reason = State.FAILED, str(exc)
            logger.error("model %s version %d refused: %s", name, version, exc)
            if self.metrics is not None:
                self.metrics.count_load_failure(name, exc.reason)
            return False
        handle.start()
        record.handle, record.state, record.reason = handle, State.READY, ""
        logger.info(
            "model %s version %d ready on %s (labels %s, max_length %d)",
            name, version, handle.provider, ", ".join(handle.labels), handle.max_length,
        )  # fmt: skip
        if self.metrics is not None:
            self.metrics.init_model(name)
            self.metrics.set_model_info(name, version, handle.provider)
        return True

    def _load_blocking(self, path: Path) -> ModelHandle:
        # Imported here: onnxruntime and tokenizers load only when a model does.
        from tokenizers import Tokenizer

        from service.model import ModelHandle
        from service.runtime import DeviceUnavailableError, Session

        try:
            manifest = Manifest.read(path)
        except ManifestError as exc:
            raise LoadError(str(exc), "invalid_manifest") from None
        if manifest.name != path.parent.name or manifest.version != int(path.name):
            raise LoadError(
                f"{path}/manifest.json says {manifest.name} version {manifest.version}",
                "invalid_manifest",
            )
        try:
            manifest.verify_files(path)
        except ManifestError as exc:
            raise LoadError(f"{path}: {exc}", "checksum_mismatch") from None
        try:
            tokenizer = Tokenizer.from_file(str(path / TOKENIZER_FILE))
            session = Session(path / MODEL_FILE, self.config.runtime)
        except DeviceUnavailableError:
            raise  # a configuration error, not this version's: startup fails with its message
        except Exception as exc:
            raise LoadError(f"{path}: {exc}", "session_error") from None
        handle = ModelHandle(
            manifest,
            path,
            session,
            tokenizer,
            batcher_config=self.config.batcher,
            max_texts_per_request=self.config.max_texts_per_request,
            tokenize_executor=self._tokenize_executor,
            inference_workers=self.config.runtime.inference_threads,
            metrics=self.metrics,
        )
        if self.config.runtime.warmup:
            try:
                handle.warmup()
            except Exception as exc:
                raise LoadError(f"{path}: warm-up failed: {exc}", "warmup_error") from None
        return handle

    async def unload_version(self, name: str, version: int, grace: float | None = None) -> None:
        """Stop serving one version: new requests go elsewhere, queued ones finish first."""
        record = self.models[name].versions[version]
        handle = record.handle
        record.state = State.UNLOADING
        if handle is not None:
            await handle.close(grace)
        record.handle, record.state = None, State.AVAILABLE

    # -- lookups -------------------------------------------------------------------------------

    def get(self, name: str | None = None, version: int | None = None) -> ModelHandle:
        """The handle serving `name` (None: the default model) at `version` (None: newest READY)."""
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
        ready = record.ready()
        if not ready or ready[0].handle is None:
            raise NotReadyError(f"model {name!r} has no ready version; {record.describe()}")
        return ready[0].handle

    def names(self) -> list[str]:
        """Models with at least one READY version, sorted."""
        return sorted(name for name, record in self.models.items() if record.ready())

    def versions(self, name: str) -> list[int]:
        """The READY versions of `name`, ascending; ModelNotFoundError if there is no such model."""
        record = self.models.get(name)
        if record is None:
            raise ModelNotFoundError(f"model {name!r} not found; models: {self._listing()}")
        return sorted(v.version for v in record.ready())

    def _listing(self) -> str:
        return ", ".join(m.describe() for m in self.models.values()) or "none"

    def handles(self) -> list[ModelHandle]:
        return [
            v.handle
            for m in self.models.values()
            for v in m.versions.values()
            if v.handle is not None
        ]

    # -- shutdown ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Drain phase: every batcher runs what is queued without waiting for batches to fill."""
        for handle in self.handles():
            handle.flush()

    async def close(self, timeout: float | None = 0.0) -> None:
        await asyncio.gather(*(h.close(timeout) for h in self.handles()))
        for record in self.models.values():
            for entry in record.versions.values():
                if entry.handle is not None:
                    entry.handle, entry.state = None, State.AVAILABLE
        self._tokenize_executor.shutdown(wait=False, cancel_futures=True)
