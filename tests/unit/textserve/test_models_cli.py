"""`textserve models`: listing a repository from manifests alone (no torch, no onnxruntime)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.handmade import make_version
from textserve import cli
from textserve.artifact import MODEL_FILE
from textserve.commands import models as models_cli


@pytest.fixture()
def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    make_version(repo, "beta", 1)
    make_version(repo, "alpha", 2)
    make_version(repo, "alpha", 10)
    (repo / "alpha" / ".tmp-123-abc").mkdir()  # an export in progress: not a version
    (repo / "alpha" / "notes").mkdir()
    return repo


def test_lists_names_versions_precision_accuracy_size(
    repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["models", "--repository", str(repository)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["NAME", "VERSION", "PRECISION", "ACCURACY", "SIZE"]
    rows = [line.split() for line in lines[1:]]
    assert [(r[0], r[1]) for r in rows] == [("alpha", "2"), ("alpha", "10"), ("beta", "1")]
    assert all(r[2] == "fp32" and r[3] == "50.00%" and r[-1] == "ok" for r in rows)


def test_json_output_has_sizes_of_the_files(
    repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["models", "--repository", str(repository), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    first = listed[0]
    version_dir = repository / "alpha" / "2"
    assert first["size_bytes"] == sum(f.stat().st_size for f in version_dir.iterdir())
    assert (first["name"], first["version"], first["precision"]) == ("alpha", 2, "fp32")
    assert first["labels"] == ["negative", "positive"]


def test_broken_versions_are_listed_and_fail_the_status(
    repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repository / "beta" / "1" / "manifest.json").unlink()
    assert cli.main(["models", "--repository", str(repository)]) == 1
    out = capsys.readouterr().out
    assert "broken:" in out and "manifest.json does not exist" in out


def test_verify_checks_the_checksums(repository: Path) -> None:
    with open(repository / "alpha" / "10" / MODEL_FILE, "ab") as fh:
        fh.write(b"\0")
    listed = {(v.name, v.version): v for v in models_cli.list_versions(repository, verify=True)}
    assert "model.onnx sha256" in (listed[("alpha", 10)].error or "")
    assert listed[("alpha", 2)].error is None
    # without --verify the manifest alone is read
    assert all(v.error is None for v in models_cli.list_versions(repository))


def test_empty_and_missing_repositories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "--repository", str(tmp_path)]) == 0
    assert "no model versions" in capsys.readouterr().out
    assert cli.main(["models", "--repository", str(tmp_path / "nope")]) == 2
    assert "model repository" in capsys.readouterr().err


def test_imports_neither_torch_nor_onnxruntime() -> None:
    code = (
        "import sys, textserve.commands.models, textserve.export.cli; "
        "heavy = [m for m in ('torch', 'onnxruntime', 'onnx') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
