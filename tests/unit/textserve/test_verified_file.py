"""open_version hands model.onnx back open and hashed (textserve.artifact.VerifiedFile): what a
loader reads through it is the file that was hashed, and a file written to afterwards is
refused."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.handmade import make_version
from textserve.artifact import ChecksumError, ManifestError, open_version, read_version


def test_the_open_file_is_the_hashed_one_and_a_later_write_is_noticed(tmp_path: Path) -> None:
    version = make_version(tmp_path / "models", "m", 1)
    manifest, files, model = open_version(version)
    with model:
        assert model.path.read_bytes() == (version / "model.onnx").read_bytes()
        assert set(files) == {"tokenizer.json"}
        assert manifest == read_version(version)[0]
        model.unchanged()  # nothing happened
        time.sleep(0.01)  # past the file system's timestamp granularity
        with (version / "model.onnx").open("r+b") as f:  # rewritten in place, same size
            data = f.read()
            f.seek(0)
            f.write(data)
        with pytest.raises(ManifestError, match="changed while it was loaded"):
            model.unchanged()
    assert model.fd == -1  # closed by the block


def test_a_wrong_checksum_is_refused_before_anything_reads_it(tmp_path: Path) -> None:
    version = make_version(tmp_path / "models", "m", 1)
    with (version / "model.onnx").open("ab") as f:
        f.write(b"\0")
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ChecksumError, match=r"model\.onnx sha256"):
        open_version(version)
    assert len(os.listdir("/proc/self/fd")) == before  # no descriptor left open


def test_a_file_renamed_over_the_name_leaves_the_hashed_bytes_in_use(tmp_path: Path) -> None:
    version = make_version(tmp_path / "models", "m", 1)
    hashed = (version / "model.onnx").read_bytes()
    other = tmp_path / "other.onnx"
    other.write_bytes(b"not the model")
    _, _, model = open_version(version)
    with model:
        os.replace(other, version / "model.onnx")  # the name now points elsewhere
        model.unchanged()  # the descriptor's inode only changed its link count: re-hashed, same
        assert model.path.read_bytes() == hashed
