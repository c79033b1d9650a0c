"""Turn one version directory into a warm ModelHandle, or refuse it with a reason.

Every check a published version must pass before it may serve, in order: the manifest (readable,
complete, for this name and version), the files it names (present, sha256 as recorded), the
tokenizer, the onnxruntime session and its graph contract, then a warm-up. A refusal is a
`LoadError` whose `reason` is a label value of textserve_model_load_failures_total.
Blocking: the repository runs it on an executor thread while the serving version goes on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from textserve.artifact import MODEL_FILE, TOKENIZER_FILE, Manifest, ManifestError
from textserve.service.config import ServerConfig
from textserve.tokenization import TokenizationError

if TYPE_CHECKING:
    from textserve.service.engine.handle import ModelHandle
    from textserve.service.metrics import Metrics


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
        entries = [(e.name, e.stat()) for e in os.scandir(path) if e.is_file()]
    except OSError:
        return ()
    return tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in entries))


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
    from textserve.service.engine.runtime import ContractError, DeviceUnavailableError, Session

    try:
        manifest = Manifest.read(path)
    except ManifestError as exc:
        raise LoadError(str(exc), "invalid_manifest") from None
    if manifest.name != path.parent.name or manifest.version != int(path.name):
        raise LoadError(
            f"{path}/manifest.json says {manifest.name} version {manifest.version}",
            "invalid_manifest",
        )
    if not (path / TOKENIZER_FILE).is_file():
        raise LoadError(f"{path}/{TOKENIZER_FILE} is missing", "tokenizer_error")
    if not (path / MODEL_FILE).is_file():
        raise LoadError(f"{path}/{MODEL_FILE} is missing", "session_error")
    try:
        manifest.verify_files(path)
    except ManifestError as exc:
        raise LoadError(f"{path}: {exc}", "checksum_mismatch") from None
    try:
        tokenizer = Tokenizer.from_file(str(path / TOKENIZER_FILE))
    except Exception as exc:
        raise LoadError(
            f"{path}/{TOKENIZER_FILE} is not a tokenizers file: {exc}", "tokenizer_error"
        ) from None
    try:
        session = Session(path / MODEL_FILE, config.runtime)
    except DeviceUnavailableError:
        raise
    except ContractError as exc:
        raise LoadError(str(exc), "contract_mismatch") from None
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
    return handle
