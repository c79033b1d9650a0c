"""Descriptions that go with the figures: the machine, the model, where its files are.

describe_machine()["usable_cpus"]
find_version(Path("models"), "default")   # models/default/3, the newest complete version
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
from pathlib import Path
from typing import Any

from textserve import procfs
from textserve.artifact import Manifest, ManifestError, iter_versions
from textserve.service.config import usable_cpus


def find_version(repository: Path, model: str) -> Path | None:
    """The newest complete version of `model` in `repository` (None when there is none)."""
    complete = []
    with contextlib.suppress(OSError):  # no such model
        for _, child in iter_versions(repository / model, complete=True):
            with contextlib.suppress(ManifestError):
                Manifest.read(child)
                complete.append(child)
    return complete[-1] if complete else None


def default_run_dir(version_dir: Path | None, model: str) -> Path:
    """The training run a version came from (its manifest says), else runs/<model>."""
    if version_dir is not None:
        recorded = Manifest.read(version_dir).extra.get("run_dir")
        if isinstance(recorded, str) and Path(recorded).is_dir():
            return Path(recorded)
    return Path("runs") / model


def describe_machine() -> dict[str, Any]:
    """Cores, CPU model, load, and the versions that decide performance."""
    cpu_model = procfs.cpu_model() or platform.processor()
    versions = {}
    for package in ("onnxruntime", "onnxruntime-gpu", "grpcio", "tokenizers", "numpy", "torch"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    return {
        "cpu_model": cpu_model,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def describe_model(version_dir: Path | None, run_dir: Path) -> dict[str, Any]:
    if version_dir is None:
        return {}
    manifest = Manifest.read(version_dir)
    shape = None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        shape = json.loads((run_dir / "config.json").read_text())["model"]
    return {
        "path": str(version_dir),
        "name": manifest.name,
        "version": manifest.version,
        "precision": manifest.precision,
        "max_length": manifest.max_length,
        "labels": manifest.labels,
        "run_dir": str(run_dir),
        "model_config": shape,  # d_model, n_layers, ... from the run (None if not found)
    }
