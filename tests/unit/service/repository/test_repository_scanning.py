"""What a scan of the repository tells the operator, and what it changes.

Startup errors that say what is wrong and how to fix it; folders that are skipped, said once
with where they are; a model folder that cannot be listed keeps its versions (said once per
change) without holding up the other models; a model whose folder is removed is forgotten
(metrics or not; while the server starts: shown without versions until the next scan) and one
unloaded by hand leaves textserve_model_info; a refused version fixed on disk is offered again
without its old refusal. Real repositories of hand-built versions.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.handmade import make_version
from tests.serving import repository_config, run_repository_with
from tests.serving import run_repository as run
from tests.unit.service.repository.helpers import (
    break_checksum,
    drained,
    nothing,
    ready_models,
    ready_versions,
)
from textserve.artifact import MODEL_FILE
from textserve.service.errors import ModelNotFoundError, NotReadyError
from textserve.service.repository import core
from textserve.service.repository.core import ModelRepository, ReloadEvent, StartupError

LOGGER = "textserve.service.repository.core"
CPU = "CPUExecutionProvider"


def startup_error(root: Path, **overrides: Any) -> str:
    with pytest.raises(StartupError) as caught:
        run(root, nothing, **overrides)
    return str(caught.value)


def test_startup_errors_say_what_is_wrong_and_how_to_fix_it(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert startup_error(empty) == (
        f"no model versions in {empty} (expected {empty}/<name>/<version>/manifest.json; "
        "export one with `textserve export`)"
    )
    missing = tmp_path / "missing"
    assert startup_error(missing) == f"model repository {missing} is not a directory"

    root = tmp_path / "models"
    break_checksum(make_version(root, "m", 1))
    break_checksum(make_version(root, "m", 2))
    make_version(root, "n", 1)
    assert startup_error(root, model="c") == f"--model 'c' is not in {root}; it has m, n"
    # The named default model must load, even while another one would.
    assert startup_error(root, model="m") == (
        "default model m [versions 1 (failed), 2 (failed)] did not load (version policy latest:1)"
    )

    shutil.rmtree(root / "n")
    break_checksum(make_version(root, "n", 1))
    message = startup_error(root)  # every reason, model by model
    assert re.fullmatch(
        r"no model version could be loaded: (m [12]: [^;]*does not match the manifest[^;]*; ){2}"
        r"n 1: [^;]*does not match the manifest[^;]*",
        message,
    ), message


def test_skipped_folders_are_said_once_with_where_they_are(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "models"
    make_version(root, "m", 1)
    (root / "m" / "v2").mkdir()
    odd = b"\xff" + b"x" * 80  # not UTF-8, and longer than a log line quotes
    os.mkdir(os.fsencode(root) + b"/" + odd)

    async def body(repository: ModelRepository) -> None:
        assert await repository.reconcile() == []

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(root, body)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # Which folder of which model, and which folder of which repository (cut to 64 characters).
    assert len([w for w in warnings if "'m'" in w and "'v2'" in w]) == 1, warnings
    shown = ascii(os.fsdecode(odd)[:64])
    assert len([w for w in warnings if shown in w and str(root) in w]) == 1, warnings


def test_a_model_folder_that_cannot_be_listed_keeps_its_versions_and_is_said_once_per_problem(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "models"
    make_version(root, "a", 1)
    make_version(root, "b", 1)
    make_version(root, "b", 2)
    folder, moved = root / "a", tmp_path / "a-moved"

    def unlistable(target: str) -> None:
        """a/ turns into a link that cannot be followed, as a mount that hiccups."""
        if folder.is_symlink():
            folder.unlink()
        else:
            shutil.move(folder, moved)
        folder.symlink_to(target)

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "cannot list model" in r.getMessage()]

    async def body(repository: ModelRepository) -> None:
        unlistable("a")  # a link to itself
        shutil.rmtree(root / "b" / "2")  # b, listed after a, still sees its change
        events = await repository.reconcile()
        assert events == [ReloadEvent("b", 1, "loaded"), ReloadEvent("b", 2, "unloaded")]
        assert repository.get("a").version == 1 and ready_versions(repository, "a") == [1]
        assert said() == [  # which model, where, and why
            f"cannot list model 'a' in {root} ({os.strerror(errno.ELOOP)}); "
            "its versions stay as they were"
        ]
        assert await repository.reconcile() == []
        assert len(said()) == 1  # not at every scan
        unlistable("b/1/manifest.json/a")  # through a file
        assert await repository.reconcile() == []
        assert len(said()) == 2 and os.strerror(errno.ENOTDIR) in said()[1]  # a new problem
        folder.unlink()
        shutil.move(moved, folder)  # listed again
        assert await repository.reconcile() == []
        unlistable("a")
        assert await repository.reconcile() == []
        assert len(said()) == 3  # the same problem again, after it had gone: said again
        assert repository.get("a").version == 1

    run(root, body)


def test_a_model_whose_folder_is_removed_is_forgotten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without metrics too (ModelRepository's default)."""
    make_version(tmp_path, "m", 1)

    async def body(repository: ModelRepository) -> None:
        shutil.rmtree(tmp_path / "m")
        assert await repository.reconcile() == [ReloadEvent("m", 1, "unloaded")]
        await drained(repository)
        assert ready_models(repository) == []
        with pytest.raises(ModelNotFoundError, match=r"^model 'm' not found; models: none$"):
            repository.get()  # the default model is gone: NOT_FOUND, not "loading"
        assert await repository.reconcile() == []

    caplog.set_level(logging.INFO, logger=LOGGER)
    run_repository_with(None, tmp_path, body)
    gone = [m for m in caplog.messages if str(tmp_path) in m]  # which model left which folder
    assert len(gone) == 1 and "model m " in gone[0], gone


def test_a_model_removed_while_the_server_starts_is_shown_without_versions_then_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_version(tmp_path, "m", 1)
    make_version(tmp_path, "n", 1)
    loading, go_on = threading.Event(), threading.Event()
    real = core.load_version_dir

    def load(path: Path, *args: Any, **kwargs: Any) -> Any:
        if path.parent.name == "m":  # startup's load of m waits here
            loading.set()
            go_on.wait(30)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(core, "load_version_dir", load)

    async def main() -> None:
        repository = ModelRepository.from_server(repository_config(tmp_path))
        startup = asyncio.create_task(repository.load_all())
        try:
            await asyncio.to_thread(loading.wait, 30)
            shutil.rmtree(tmp_path / "m")
            await repository.load_model("n")  # an admin call meanwhile scans the repository
            go_on.set()
            await startup  # n serves: the server starts
            with pytest.raises(NotReadyError, match=r"; m \[versions none\]$"):
                repository.get("m")
            assert await repository.reconcile() == []
            with pytest.raises(ModelNotFoundError, match=r"models: n \[versions 1 \(ready\)\]$"):
                repository.get("m")
        finally:
            go_on.set()
            await asyncio.gather(startup, return_exceptions=True)
            await repository.close()

    asyncio.run(main())


def test_a_model_unloaded_by_hand_is_no_longer_reported_as_served(tmp_path: Path) -> None:
    make_version(tmp_path, "a", 1)
    make_version(tmp_path, "b", 1)

    async def body(repository: ModelRepository) -> None:
        await repository.unload_model("a")
        assert ready_models(repository) == ["b"]

    metrics = run(tmp_path, body)

    def served(model: str) -> float | None:
        labels = {"model": model, "version": "1", "provider": CPU, "precision": "fp32"}
        return metrics.registry.get_sample_value("textserve_model_info", labels)

    assert served("a") is None and served("b") == 1


def test_a_refused_version_fixed_on_disk_is_offered_again_without_its_old_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_version(tmp_path, "m", 1)
    broken = make_version(tmp_path, "m", 2, seed=1)
    break_checksum(broken)
    good = make_version(tmp_path / "staging", "m", 2, seed=1)

    async def body(repository: ModelRepository) -> None:
        assert repository.get().version == 1
        await repository.unload_model("m", 2)  # not tried again by the policy...
        shutil.copy(good / MODEL_FILE, broken / MODEL_FILE)  # ...while it is fixed
        caplog.clear()
        assert await repository.reconcile() == []
        with pytest.raises(NotReadyError) as caught:
            repository.get("m", 2)
        assert str(caught.value) == (
            "model 'm' version 2 is available; m [versions 1 (ready), 2 (available)]"
        )
        assert len([m for m in caplog.messages if "model m version 2 " in m]) == 1
        await repository.load_model("m", 2)
        assert repository.get().version == 2

    caplog.set_level(logging.INFO, logger=LOGGER)
    run(tmp_path, body)
