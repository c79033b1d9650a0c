"""Shared pytest fixtures for every tier."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def one_worker_by_default() -> Iterator[None]:
    """`textserve serve` defaults to --workers auto (several processes on a multi-core
    machine); the servers the tests start (in this process or as children, which inherit the
    environment) get one process unless they ask for workers (tests/integration/
    test_workers.py), so their signals, exit statuses and in-process errors stay a single
    process's. A TEXTSERVE_WORKERS the caller set is kept; the environment is restored after
    the session."""
    with pytest.MonkeyPatch.context() as patch:
        if "TEXTSERVE_WORKERS" not in os.environ:
            patch.setenv("TEXTSERVE_WORKERS", "1")
        yield


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete run directory (every file of the contract) trained once per session.

    A learnable 3-label synthetic data set through the real `train()` path, tiny preset,
    max_length 64; a few seconds on one CPU thread. Test accuracy is ~1.0.
    """
    pytest.importorskip("torch")
    from textserve.model.synthetic import synthetic_rows, write_jsonl
    from textserve.model.train import TrainConfig, train

    root = tmp_path_factory.mktemp("tiny_run")
    data = write_jsonl(synthetic_rows(600, seed=0), root / "synthetic.jsonl")
    cfg = TrainConfig(
        data=data,
        preset="tiny",
        model_overrides={"max_length": 64},
        epochs=8,
        batch_size=16,
        lr=3e-3,
        patience=8,
        seed=0,
        device="cpu",
        threads=1,
        output_dir=root / "run",
        progress=False,
    )
    return train(cfg)


@pytest.fixture(scope="session")
def tiny_repository(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository (the models/ dir) holding `tiny/1/`: tiny_run exported once per session.

    Through the real `export_run` (fp32, ORT-optimized, every check passed), so model.onnx,
    tokenizer.json and manifest.json are exactly what `textserve export` publishes. Shared by
    the session: treat it as read-only, and `shutil.copytree` it to add or break versions.
    """
    pytest.importorskip("onnxruntime")
    from textserve.export.pipeline import export_run

    repository = tmp_path_factory.mktemp("models")
    export_run(tiny_run, repository, "tiny", threads=1)
    return repository
