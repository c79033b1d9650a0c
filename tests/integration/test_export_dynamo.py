"""The dynamo-based exporter (the alternative to the default TorchScript one) passes every check."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from textserve.artifact import Manifest
from textserve.export import pipeline


@pytest.mark.slow
def test_dynamo_exporter_passes_the_same_checks(tiny_run: Path, tmp_path: Path) -> None:
    # ~10 s: torch.export tracing dominates, whatever the model size.
    version_dir = pipeline.export_run(tiny_run, tmp_path, "d", exporter="dynamo", threads=1)
    manifest = Manifest.read(version_dir)
    manifest.verify_files(version_dir)
    assert manifest.parity["max_abs_logit_diff"] <= 1e-4
    assert manifest.parity["argmax_agreement"] == 1.0
    assert manifest.extra["exporter"] == "torch.onnx.export (dynamo)"
