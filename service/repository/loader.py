"""Turn one version directory into a warm ModelHandle, or refuse it with a reason.

Every check a published version must pass before it may serve, in order: the manifest (a
regular file within its size cap, valid by the schema, for this name and version), the files
it names (regular files of the version directory within their caps, sha256 as recorded), the
tokenizer, the onnxruntime session and its graph contract, then a warm-up. The tokenizer is
built from the bytes that were hashed; onnxruntime reads model.onnx from the very descriptor
that was hashed (never its path again) and the file is refused if it changed meanwhile, so a
large model costs no copy of itself in memory (textserve.artifact.open_version). A refusal is
a `LoadError` whose `reason` is a label value of textserve_model_load_failures_total.
Blocking: the repository runs it on an executor thread while the serving version goes on.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from textserve.artifact import (
    MANIFEST_FILE,
    MODEL_FILE,
    TOKENIZER_FILE,
    ChecksumError,
    Manifest,
    ManifestError,
    MissingFileError,
    UnsafeFileError,
    VerifiedFile,
    identity,
    open_version,
)
from textserve.service.config import ServerConfig
from textserve.tokenization import TokenizationError

if TYPE_CHECKING:
    from textserve.service.engine.handle import ModelHandle
    from textserve.service.engine.runtime import Session
    from textserve.service.metrics import Metrics

logger = logging.getLogger(__name__)


class LoadError(Exception):
    """A version that cannot be served; `reason` is a textserve_model_load_failures_total label."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# (name, size, mtime_ns) of each file of a version directory, sorted
Files = tuple[tuple[str, int, int], ...]


def fingerprint(path: Path) -> Files:
    """(name, size, mtime) of each file of a version directory: a refused version is tried
    again only once its files change (e.g. a copy that was still being written), and a served
    one rewritten in place is noticed."""
    try:
        # Not following links: a link's own change is noticed, and nothing outside is touched.
        entries = [
            (e.name, e.stat(follow_symlinks=False))
            for e in os.scandir(path)
            if e.is_file(follow_symlinks=False) or e.is_symlink()
        ]
    except OSError:
        return ()
    return tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in entries))


# A missing file of the contract is refused as its loader would have been.
_MISSING_REASONS = {
    MANIFEST_FILE: "invalid_manifest",
    MODEL_FILE: "session_error",
    TOKENIZER_FILE: "tokenizer_error",
}


def _open(path: Path) -> tuple[Manifest, dict[str, bytes], VerifiedFile]:
    """open_version(path), its refusals as LoadErrors with their reasons."""
    try:
        return open_version(path)
    except MissingFileError as exc:
        raise LoadError(str(exc), _MISSING_REASONS.get(exc.file, "invalid_manifest")) from None
    except UnsafeFileError as exc:
        raise LoadError(str(exc), "unsafe_file") from None
    except ChecksumError as exc:
        raise LoadError(f"{path}: {exc}", "checksum_mismatch") from None
    except ManifestError as exc:
        raise LoadError(str(exc), "invalid_manifest") from None


def load_version_dir(
    path: Path,
    config: ServerConfig,
    *,
    metrics: Metrics | None,
) -> ModelHandle:
    """A warmed-up, not yet started ModelHandle for models/<name>/<version>/ (`path`).

    Raises LoadError for anything wrong with the version, DeviceUnavailableError when the
    configured device is missing (a configuration error, not this version's).
    """
    # Imported here: onnxruntime and tokenizers load only when a model does.
    from tokenizers import Tokenizer

    from textserve.service.engine.handle import ModelCheckError, ModelHandle
    from textserve.service.engine.runtime import ContractError, DeviceUnavailableError

    manifest, files, model = _open(path)
    model_bytes: bytes | None = None  # --engine process: what the engine process loads
    with model:  # the verified descriptor, closed once onnxruntime has read it
        if (manifest.name, manifest.version) != identity(path):
            raise LoadError(
                f"{path}/manifest.json says {manifest.name[:64]} version {manifest.version}",
                "invalid_manifest",
            )
        try:
            tokenizer = Tokenizer.from_buffer(files[TOKENIZER_FILE])
        except Exception as exc:
            raise LoadError(
                f"{path}/{TOKENIZER_FILE} is not a tokenizers file: {exc}", "tokenizer_error"
            ) from None
        try:
            session = _session(path, manifest, model.path, config)
            if config.runtime.engine != "thread":
                model_bytes = Path(model.path).read_bytes()
            model.unchanged()  # what onnxruntime read is what was hashed
        except DeviceUnavailableError:
            raise
        except ContractError as exc:
            raise LoadError(str(exc), "contract_mismatch") from None
        except ManifestError as exc:  # changed while it was loaded: tried again later
            raise LoadError(str(exc), "checksum_mismatch") from None
        except Exception as exc:
            raise LoadError(f"{path}: {exc}", "session_error") from None
    try:
        handle = ModelHandle(
            manifest,
            path,
            session,
            tokenizer,
            batcher_config=config.batcher,
            max_texts_per_request=config.max_texts_per_request,
            inference_workers=config.runtime.inference_threads,
            inference_nice=config.runtime.inference_nice,
            metrics=metrics,
        )
        # Even without warm-up: a few one-row runs, and a misfit served fails requests instead.
        handle.check()
    except TokenizationError as exc:  # e.g. no [UNK]: a text with no tokens could not run
        session.close()
        raise LoadError(f"{path}/{TOKENIZER_FILE}: {exc}", "tokenizer_error") from None
    except ModelCheckError as exc:
        session.close()
        raise LoadError(f"{path}: {exc}", exc.reason) from None
    if config.runtime.warmup:
        try:
            handle.warmup()
        except Exception as exc:
            session.close()
            raise LoadError(f"{path}: warm-up failed: {exc}", "warmup_error") from None
    if model_bytes is not None:
        _use_engine_process(handle, model_bytes, files[TOKENIZER_FILE], config)
    return handle


def _session(path: Path, manifest: Manifest, model: Path, config: ServerConfig) -> Session:
    """The version's onnxruntime session, made in a thread below the loop's priority so that
    onnxruntime's pool threads are too (engine/priority.py)."""
    from textserve.service.engine.priority import in_lowered_thread
    from textserve.service.engine.runtime import Session

    return in_lowered_thread(
        lambda: Session(
            model,
            config.runtime,
            source=path / MODEL_FILE,
            inputs=manifest.inputs,
            per_token=manifest.tags_tokens,
        ),
        config.runtime.inference_nice,
    )


def _use_engine_process(
    handle: ModelHandle, model: bytes, tokenizer: bytes, config: ServerConfig
) -> None:
    """--engine process: the version's batches run in a process of their own; --engine shared
    under a supervisor: in the one engine process every worker feeds (with one process, as
    --engine process). A token classifier's stay in the worker: its rows are entities."""
    if handle.tags_tokens:
        logger.info("%s: a token classifier runs in the worker, not --engine process", handle.path)
        return
    from textserve.service.engine.remote import EngineProcess

    runtime = config.runtime
    try:
        if runtime.engine == "shared" and runtime.engine_hub:
            from textserve.service.engine.hub import SharedEngine

            key = bytes.fromhex(runtime.engine_hub_key)
            engine: EngineProcess = SharedEngine(
                runtime.engine_hub, key, model, tokenizer, handle.manifest
            )
        else:
            engine = EngineProcess(
                model, tokenizer, handle.manifest, runtime, config.batcher.max_batch_tokens
            )
    except Exception as exc:
        handle.runner.session.close()
        raise LoadError(
            f"{handle.path}: the engine process failed: {exc}", "session_error"
        ) from None
    handle.use_engine(engine)
