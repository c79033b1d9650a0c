"""What the repository tests share: a model's load-failure count, edits that break or
re-seal a hand-made version (tests/handmade.py), a drain awaited, and the empty test body.

Plain functions the test modules of this folder import; the fixtures they share (tiny_run,
tiny_repository) are in tests/conftest.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import onnx

from textserve.artifact import MODEL_FILE, TOKENIZER_FILE, sha256_file
from textserve.service.metrics import Metrics
from textserve.service.repository.core import ModelRepository


def failures(metrics: Metrics, reason: str, model: str = "m") -> float:
    labels = {"model": model, "reason": reason}
    return metrics.registry.get_sample_value("textserve_model_load_failures_total", labels) or 0


def reseal(path: Path) -> None:
    """Make the manifest's checksums match the files again (a broken but consistent version)."""
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["sha256"] = {f: sha256_file(path / f) for f in (MODEL_FILE, TOKENIZER_FILE)}
    (path / "manifest.json").write_text(json.dumps(manifest))


def break_checksum(path: Path) -> None:
    with open(path / MODEL_FILE, "ab") as fh:
        fh.write(b"corrupted")


def rename_input(path: Path) -> None:
    model = onnx.load(str(path / MODEL_FILE))
    model.graph.input[0].name = "ids"
    for node in model.graph.node:
        node.input[:] = ["ids" if i == "input_ids" else i for i in node.input]
    onnx.save(model, str(path / MODEL_FILE))
    reseal(path)


def edit_manifest(path: Path, **changes: Any) -> None:
    data = json.loads((path / "manifest.json").read_text())
    data.update(changes)
    (path / "manifest.json").write_text(json.dumps(data))


async def drained(repository: ModelRepository) -> None:
    await asyncio.gather(*list(repository._drains.values()))


async def nothing(repository: ModelRepository) -> None:
    return None


def ready_versions(repository: ModelRepository, name: str) -> list[int]:
    """The READY versions of `name`, ascending."""
    return sorted(v.version for v in repository.models[name].ready())


def ready_models(repository: ModelRepository) -> list[str]:
    """The models with a READY version, sorted."""
    return sorted(name for name, record in repository.models.items() if record.ready())
