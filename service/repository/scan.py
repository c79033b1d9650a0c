"""What is on disk: models/<name>/<version>/ directories, read as untrusted input.

A version is what `textserve.artifact.iter_versions` lists (a directory named by a canonical
decimal within 1..2**63-1 holding a manifest.json); anything else under a model is not a
version and is skipped (the repository says so once per name). A model whose directory cannot
be listed is reported, not dropped: its versions must not look removed (and be retired) because
a mount hiccupped, and it must not stop the scan of the other models.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from textserve.artifact import iter_versions, shown
from textserve.service.repository.loader import Files, fingerprint


@dataclass
class ScanResult:
    found: dict[str, dict[int, Path]] = field(default_factory=dict)  # model -> version -> dir
    unreadable: dict[str, str] = field(default_factory=dict)  # model -> why it was not listed
    not_versions: set[tuple[str, str]] = field(default_factory=set)  # (model, directory name)
    not_models: set[str] = field(default_factory=set)  # directory names that are not text
    files: dict[Path, Files] = field(default_factory=dict)  # fingerprints of watched versions


class ScanLog:
    """Says once per name what a scan skipped, and once per change which model directories
    could not be listed (their versions stay as they were); on the repository's logger."""

    def __init__(self, root: Path, logger: logging.Logger) -> None:
        self.root = root
        self.logger = logger
        self._not_versions: set[tuple[str, str]] = set()
        self._not_models: set[str] = set()
        self._unreadable: dict[str, str] = {}

    def report(self, result: ScanResult) -> None:
        for model, name in sorted(result.not_versions - self._not_versions):
            self.logger.warning(
                "model %s: folder %s is not a version (a version is a decimal number from 1 to "
                "2**63-1 without leading zeros); skipped",
                shown(model), shown(name),
            )  # fmt: skip
        self._not_versions = result.not_versions  # forgotten once gone: bounded by the disk
        for name in sorted(result.not_models - self._not_models):
            self.logger.warning(
                "folder %s of %s is not a model: its name is not UTF-8 text; skipped",
                ascii(name[:64]), self.root,
            )  # fmt: skip
        self._not_models = result.not_models
        for model, problem in result.unreadable.items():
            if self._unreadable.get(model) != problem:
                self.logger.error(
                    "cannot list model %s in %s (%s); its versions stay as they were",
                    shown(model), self.root, problem,
                )  # fmt: skip
        self._unreadable = dict(result.unreadable)


def scan_repository(root: Path, watched: Iterable[Path] = ()) -> ScanResult:
    """Every model directory of `root` (hidden ones aside) and its versions; the fingerprint of
    each `watched` version directory. OSError only when `root` itself cannot be listed."""
    result = ScanResult()
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        if not _is_text(entry.name):
            # Bytes that are not UTF-8: as a model name it would fail every ListModels and
            # /metrics scrape that carried it (protobuf strings and exposition are UTF-8).
            result.not_models.add(entry.name)
            continue
        try:
            if not entry.is_dir():
                continue
            versions = _versions(Path(entry.path), entry.name, result.not_versions)
        except OSError as exc:
            result.unreadable[entry.name] = exc.strerror or str(exc)
            continue
        if versions:
            result.found[entry.name] = versions
    result.files = {path: fingerprint(path) for path in watched}
    return result


def _versions(model_dir: Path, model: str, not_versions: set[tuple[str, str]]) -> dict[int, Path]:
    # A directory without a manifest is still being written; a symbolic link is listed, so that
    # loading it refuses it with a reason (a version must be a directory of the repository).
    skipped: set[str] = set()
    versions = dict(iter_versions(model_dir, complete=True, skipped=skipped))
    not_versions.update((model, name) for name in skipped)
    return versions


def _is_text(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes come back from the OS as lone surrogates
        return False
    return True


def scan(root: Path) -> dict[str, dict[int, Path]]:
    """models/<name>/<version>/ directories by model and version (see scan_repository)."""
    return scan_repository(root).found
