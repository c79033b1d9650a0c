"""What the repository makes of the files and folders it finds, and what it says about them.

Guards the loader's refusals (each names the file of the version at fault, quotes a foreign
manifest name cut short, labels a failed warm-up `warmup_error`), that a loaded version serves
from its own directory with the configured number of inference threads, that a refused version
is retried only when its own files change (not what a link of it points at), and that the scan
skips hidden folders, stray files and non-UTF-8 names without losing the models listed after
them, and keeps (and reports once) a model whose folder cannot be listed.
Real repositories of hand-made versions (tests/handmade.py), real onnxruntime, no gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.handmade import make_version
from tests.serving import run_repository as run
from tests.unit.service.repository.helpers import (
    edit_manifest,
    failures,
    ready_models,
    rename_input,
    reseal,
)
from textserve.artifact import MODEL_FILE
from textserve.service.config import BatcherConfig, RuntimeConfig
from textserve.service.engine import runtime
from textserve.service.engine.runtime import Session
from textserve.service.repository.core import ModelRepository, State

CORE_LOG = "textserve.service.repository.core"


def fix_batch_to_one(path: Path) -> None:
    """A graph exported with a static batch of 1: one-row checks pass, a full batch does not."""
    model = onnx.load(str(path / MODEL_FILE))
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(model, str(path / MODEL_FILE))
    reseal(path)


# -- loading: the reasons of a refusal -----------------------------------------------------------


def test_a_refusal_names_the_file_at_fault_and_cuts_a_foreign_name_short(tmp_path: Path) -> None:
    good = make_version(tmp_path, "m", 1)
    contract = make_version(tmp_path, "m", 2, seed=1)
    rename_input(contract)
    foreign = make_version(tmp_path, "m", 3, seed=2)
    edit_manifest(foreign, name="x" * 100)

    async def body(repository: ModelRepository) -> None:
        versions = repository.models["m"].versions
        assert versions[3].state is State.FAILED
        # the name is the manifest's, untrusted: cut to 64 characters
        assert versions[3].reason == f"{foreign}/manifest.json says {'x' * 64} version 3"
        assert versions[2].state is State.FAILED
        assert versions[2].reason.startswith(f"{contract / MODEL_FILE} has inputs ['ids', ")
        handle = repository.get()
        assert (handle.version, handle.path) == (1, good)  # served from its own directory

    metrics = run(tmp_path, body)
    assert failures(metrics, "invalid_manifest") == 1
    assert failures(metrics, "contract_mismatch") == 1


def test_a_version_that_fails_its_warm_up_is_refused_and_the_serving_one_stays(
    tmp_path: Path,
) -> None:
    make_version(tmp_path, "m", 1)
    static = make_version(tmp_path, "m", 2, seed=1)
    fix_batch_to_one(static)

    async def body(repository: ModelRepository) -> None:
        entry = repository.models["m"].versions[2]
        assert entry.state is State.FAILED
        assert entry.reason.startswith(f"{static}: warm-up failed: "), entry.reason
        assert repository.get().version == 1
        assert await repository.reconcile() == []  # not tried again unchanged

    metrics = run(tmp_path, body)
    assert failures(metrics, "warmup_error") == 1
    assert failures(metrics, "other") == 0


def test_two_inference_threads_run_two_batches_of_a_model_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_version(tmp_path, "m", 1)
    # Each of the first two runs waits for the other: they pass only if they run side by side.
    # (The timeout only ends a wrong run: with one thread the second batch never starts.)
    both = threading.Barrier(2, timeout=30)
    real_run = Session.run
    runs: list[int] = []

    def run_together(self: Session, input_ids: np.ndarray, attention_mask: np.ndarray) -> Any:
        runs.append(len(input_ids))
        if len(runs) <= 2:
            both.wait()
        return real_run(self, input_ids, attention_mask)

    async def body(repository: ModelRepository) -> None:
        handle = repository.get()
        monkeypatch.setattr(Session, "run", run_together)
        first, second = await asyncio.gather(
            handle.classify(["a good film"]), handle.classify(["a bad plot"])
        )
        assert first.probabilities.shape == second.probabilities.shape == (1, 2)
        assert runs[:2] == [1, 1]  # two batches of one text each

    runtime = RuntimeConfig(device="cpu", intra_op_threads=1, inference_threads=2)
    run(tmp_path, body, runtime=runtime, batcher=BatcherConfig(max_batch_size=1))


def take_token_type_ids(path: Path) -> None:
    """The graph takes a third input, token_type_ids, as BERT-like exports do, and the manifest
    (format 2) lists it. onnxruntime needs every graph input fed, so a served text proves the
    loaded version feeds it."""
    model = onnx.load(str(path / MODEL_FILE))
    model.graph.input.append(
        helper.make_tensor_value_info(
            "token_type_ids", TensorProto.INT64, ["batch_size", "sequence_length"]
        )
    )
    onnx.save(model, str(path / MODEL_FILE))
    edit_manifest(path, format_version=2, inputs=["input_ids", "attention_mask", "token_type_ids"])
    reseal(path)


def test_a_graph_that_takes_token_type_ids_serves_as_its_manifest_lists_them(
    tmp_path: Path,
) -> None:
    make_version(tmp_path, "m", 1)
    take_token_type_ids(make_version(tmp_path, "m", 2, seed=1))

    async def body(repository: ModelRepository) -> None:
        assert repository.models["m"].versions[2].state is State.READY
        handle = repository.get()
        assert handle.version == 2
        result = await handle.classify(["a good film", "the plot is awful"])
        assert result.probabilities.shape == (2, 2)

    metrics = run(tmp_path, body)
    assert failures(metrics, "contract_mismatch") == 0


def test_a_model_file_rewritten_while_onnxruntime_reads_it_is_refused_then_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes onnxruntime read may not be the ones hashed: refused as a checksum mismatch
    naming the file, and loaded at the next scan once the writer is done (its files changed)."""
    make_version(tmp_path, "m", 1)
    rewritten = make_version(tmp_path, "m", 2, seed=1) / MODEL_FILE
    writes: list[Path] = []

    class RewrittenWhileRead(Session):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if kwargs.get("source") == rewritten and not writes:
                writes.append(rewritten)
                rewritten.write_bytes(rewritten.read_bytes())  # in place, the same bytes

    monkeypatch.setattr(runtime, "Session", RewrittenWhileRead)

    async def body(repository: ModelRepository) -> None:
        entry = repository.models["m"].versions[2]
        assert writes == [rewritten]
        assert entry.state is State.FAILED
        assert entry.reason == f"{rewritten} changed while it was loaded; it is tried again later"
        assert repository.get().version == 1
        assert (2, "loaded") in [(e.version, e.action) for e in await repository.reconcile()]
        assert repository.get().version == 2

    metrics = run(tmp_path, body)
    assert failures(metrics, "checksum_mismatch") == 1
    assert failures(metrics, "other") == 0


# -- fingerprints: what makes a refused version worth another try --------------------------------


def test_a_refused_version_is_not_retried_when_only_what_its_link_points_at_changes(
    tmp_path: Path,
) -> None:
    repository = tmp_path / "models"
    make_version(repository, "m", 1)
    outside = tmp_path / "outside" / MODEL_FILE

    async def body(repo: ModelRepository) -> None:
        linked = make_version(repository, "m", 2, seed=1)
        outside.parent.mkdir()
        shutil.move(linked / MODEL_FILE, outside)
        (linked / MODEL_FILE).symlink_to(outside)
        assert [e.action for e in await repo.reconcile()] == ["refused"]
        with open(outside, "ab") as fh:  # grows: its size and mtime change, the link's do not
            fh.write(b"\0" * 100)
        assert await repo.reconcile() == []
        (linked / MODEL_FILE).unlink()
        shutil.copy(outside, linked / MODEL_FILE)  # the version's own file changed
        assert [e.action for e in await repo.reconcile()] == ["refused"]

    metrics = run(repository, body)
    assert failures(metrics, "unsafe_file") == 1
    assert failures(metrics, "checksum_mismatch") == 1


# -- the scan ------------------------------------------------------------------------------------


def test_hidden_folders_stray_files_and_odd_names_skip_only_themselves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each skipped entry sorts before a model that must still be found."""
    repository = tmp_path / "models"
    make_version(repository, ".staging", 1)  # a hidden folder: not a model, however complete
    (repository / "README.md").write_text("models here\n")  # a file: not a model
    # Exports in progress beside the versions, interleaved: a model folder is listed in the
    # file system's order, and some version comes after a hidden entry.
    for version in range(1, 6):
        (repository / "m" / f".tmp-{version}").mkdir(parents=True)
        make_version(repository, "m", version, seed=version)
    (repository / "m" / ".DS_Store").write_bytes(b"\0")
    odd = Path(os.fsdecode(os.fsencode(repository) + b"/\xff"))  # sorts after "m"...
    shutil.copytree(repository / "m", odd)
    last = "\uff4d"  # ...and before this fullwidth m
    make_version(repository, last, 1)

    async def body(repo: ModelRepository) -> None:
        assert sorted(repo.models) == ready_models(repo) == ["m", last]
        assert repo.models["m"].describe() == (
            "m [versions 1 (available), 2 (available), 3 (available), 4 (available), 5 (ready)]"
        )
        assert await repo.reconcile() == []

    with caplog.at_level(logging.WARNING, logger=CORE_LOG):
        run(repository, body)
    assert "is not a version" not in caplog.text
    assert caplog.text.count("is not a model: its name is not UTF-8 text") == 1
