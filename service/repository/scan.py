"""What is on disk: models/<name>/<version>/ directories, read as untrusted input.

A version is what `textserve.artifact.iter_versions` lists (a directory named by a canonical
decimal within 1..2**63-1 holding a manifest.json); anything else under a model is not a
version and is skipped (the repository says so once per name). A model whose directory cannot
be listed is reported, not dropped: its versions must not look removed (and be retired) because
a mount hiccupped, and it must not stop the scan of the other models.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from textserve.artifact import iter_versions
from textserve.service.repository.loader import Files, fingerprint


@dataclass
class ScanResult:
    found: dict[str, dict[int, Path]] = field(default_factory=dict)  # model -> version -> dir
    unreadable: dict[str, str] = field(default_factory=dict)  # model -> why it was not listed
    not_versions: set[tuple[str, str]] = field(default_factory=set)  # (model, directory name)
    not_models: set[str] = field(default_factory=set)  # directory names that are not text
    files: dict[Path, Files] = field(default_factory=dict)  # fingerprints of watched versions


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
