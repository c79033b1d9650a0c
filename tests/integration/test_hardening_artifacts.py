"""Artifacts the server refuses: a published version whose model.onnx or tokenizer.json no longer
matches the sha256 in its manifest is never served (`textserve serve` exits 2 naming the file).
(No unpickling anywhere: tests/unit/textserve/test_no_unpickling.py; non-root image:
tests/system/test_dockerfile.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from textserve.artifact import iter_versions
from textserve.cli import main as cli_main


@pytest.mark.parametrize("victim", ["model.onnx", "tokenizer.json"])
def test_a_tampered_file_is_refused_at_startup(
    tiny_repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], victim: str
) -> None:
    repository = tmp_path / "models"
    shutil.copytree(tiny_repository, repository)
    (version,) = [path for model in repository.iterdir() for _, path in iter_versions(model)]
    path = version / victim
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit: same size, same format, different file
    path.write_bytes(bytes(data))
    argv = ["serve", "--repository", str(repository), "--listen", "127.0.0.1:0",
            "--metrics-port", "off"]  # fmt: skip
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert f"{victim} sha256" in err and "does not match the manifest" in err
