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


def test_onnxruntime_runs_the_bytes_that_were_hashed_when_another_file_is_renamed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the hash and the load a file renamed over model.onnx (an export publishing,
    an attacker with write access) is not what runs: onnxruntime reads the descriptor that
    was hashed, never the name again."""
    import os

    import numpy as np
    import onnxruntime as ort

    from tests.handmade import make_version
    from textserve.service.config import ServerConfig
    from textserve.service.repository import loader

    good = make_version(tmp_path / "models", "m", 1, seed=0)
    other = make_version(tmp_path / "other", "m", 1, seed=1)  # other weights, same shapes
    ids = np.array([[2, 3, 4, 5]], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}

    def logits(model: Path) -> np.ndarray:
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        return np.asarray(session.run(["logits"], feeds)[0])

    want, swapped_in = logits(good / "model.onnx"), logits(other / "model.onnx")
    assert np.abs(want - swapped_in).max() > 1e-4  # the two graphs answer apart
    real_open = loader.open_version

    def open_then_swap(path: Path) -> object:
        opened = real_open(path)  # hashed, and held open
        os.replace(other / "model.onnx", path / "model.onnx")  # renamed over the name
        return opened

    monkeypatch.setattr(loader, "open_version", open_then_swap)
    handle = loader.load_version_dir(
        good, ServerConfig(repository=tmp_path / "models"), metrics=None
    )
    try:
        got = handle.runner.session.run(ids, np.ones_like(ids))
    finally:
        handle.runner.session.close()
    np.testing.assert_allclose(got, want, atol=1e-6)
