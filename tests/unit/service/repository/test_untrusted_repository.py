"""The model repository as untrusted input (issue #20): one test per case seen in the wild.

Each case is dropped beside a good version of a real repository (hand-made versions, real
onnxruntime, no gRPC): the bad one is skipped (not a version) or FAILED with a reason and
counted, the good one keeps serving, nothing outside the repository is opened, and no scan
raises. tests/integration/test_untrusted_repository_served.py drives the same through a server.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.handmade import make_version
from tests.serving import run_repository as run
from tests.unit.service.repository.helpers import (
    edit_manifest,
    failures,
    ready_models,
    ready_versions,
)
from tests.untrusted import OPENED as _OPENED
from tests.untrusted import WATCHED as _WATCHED
from textserve import artifact
from textserve.artifact import MODEL_FILE, TOKENIZER_FILE, parse_version, sha256_file
from textserve.service.repository import core
from textserve.service.repository.core import ModelRepository, State


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[Path]:
    """A file outside the repository (tmp_path/models) that nothing may open."""
    path = tmp_path / "outside" / "secret"
    path.parent.mkdir()
    path.write_bytes(b"not for the server\n")
    _WATCHED.add(str(path))
    _OPENED.clear()
    yield path
    _WATCHED.discard(str(path))
    assert not _OPENED, f"opened outside the repository: {_OPENED}"


def good_copy(repository: Path, name: str) -> Path:
    """A good version 2 of m written under a directory named `name` (manifest version 2)."""
    staging = make_version(repository.parent / f"staging-{name.encode().hex()[:16]}", "m", 2)
    target = repository / "m" / name
    shutil.copytree(staging, target)
    return target


# -- version directory names -------------------------------------------------------------------


def test_parse_version_takes_canonical_int64_decimals_only() -> None:
    assert [parse_version(n) for n in ("1", "42", str(2**63 - 1))] == [1, 42, 2**63 - 1]
    for name in ("", "0", "007", "-1", "+1", " 1", "1 ", "1.0", "1e3", "²", "١", "１",
                 str(2**63), "9" * 23, "9" * 5000):  # fmt: skip
        assert parse_version(name) is None, name


def test_a_version_above_int64_is_not_a_version(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    make_version(repository, "m", 1)
    huge = "99999999999999999999999"
    edit_manifest(good_copy(repository, huge), version=int(huge))

    async def body(repo: ModelRepository) -> None:
        assert await repo.reconcile() == []
        assert repo.get().version == 1 and ready_versions(repo, "m") == [1]
        assert sorted(repo.models["m"].versions) == [1]

    run(repository, body)


def test_a_superscript_digit_folder_is_skipped_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repository = tmp_path / "models"
    make_version(repository, "m", 1)
    good_copy(repository, "²")  # str.isdigit() is true, int() fails: every scan raised

    async def body(repo: ModelRepository) -> None:
        make_version(repository, "m", 3, seed=2)  # a new good version is still picked up
        events = await repo.reconcile()
        assert [(e.version, e.action) for e in events] == [(3, "loaded"), (1, "unloaded")]
        for _ in range(2):
            assert await repo.reconcile() == []
        await repo.load_model("m")  # the admin calls answer too

    with caplog.at_level("WARNING", logger="textserve.service.repository.core"):
        run(repository, body)  # startup did not exit
    assert caplog.text.count("folder '²' is not a version") == 1


def test_a_model_folder_whose_name_is_not_utf8_is_not_a_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its name would fail every ListModels (protobuf strings) and /metrics scrape."""
    repository = tmp_path / "models"
    make_version(repository, "m", 1)
    odd = Path(os.fsdecode(os.fsencode(repository) + b"/\xff"))
    shutil.copytree(make_version(tmp_path / "staging", "m", 1).parent, odd)
    edit_manifest(odd / "1", name=odd.name)  # "\udcff": what loaded and was served before

    async def body(repo: ModelRepository) -> None:
        assert list(repo.models) == ["m"] and await repo.reconcile() == []

    with caplog.at_level("WARNING", logger="textserve.service.repository.core"):
        run(repository, body)
    assert caplog.text.count("'\\udcff' of") == 1 and "not UTF-8 text" in caplog.text


# -- the manifest --------------------------------------------------------------------------------


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_manifest(path: Path) -> None:
    """extra nested 100,000 deep: json.loads raised RecursionError in every scan."""
    text = (path / "manifest.json").read_text().rstrip()
    text = text[:-1] + f', "extra": {{"x": {_nested(100_000)}}}}}'
    (path / "manifest.json").write_text(text)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"labels": [0, 1]}, "labels/0: 0 is not of type 'string'"),  # was READY, then INTERNAL
        ({"labels": [{"a": 1}, {"b": 2}]}, "labels/0: {'a': 1} is not of type 'string'"),
        ({"labels": []}, "labels: [] should be non-empty"),
        ({"labels": ["a", "a"]}, "has non-unique elements"),
        ({"labels": ["a", ""]}, "labels/1: '' should be non-empty"),
        ({"sha256": {MODEL_FILE: 1, TOKENIZER_FILE: 2}}, "sha256/model.onnx: 1 is not of type"),
        ({"sha256": [MODEL_FILE, TOKENIZER_FILE]}, "is not of type 'object'"),
        ({"sha256": {MODEL_FILE: "A" * 64, TOKENIZER_FILE: "0" * 64}}, "does not match"),
        ({"version": 2.0}, "version: 2.0 is not of type 'integer'"),
        ({"max_length": 2**40}, "max_length: 1099511627776 is greater than the maximum"),
        ({"pad_token_id": -1}, "pad_token_id: -1 is less than the minimum"),
        ({"test_accuracy": "high"}, "test_accuracy: 'high' is not of type 'number'"),
        ({"surprise": 1}, "Additional properties are not allowed"),
        ({"extra": json.loads(_nested(40))}, "nested over 32 levels deep"),
        (deep_manifest, "nested too deeply"),
        ({"labels": ["\ud800", "b"]}, "not valid Unicode text"),
    ],
    ids=lambda v: v.__name__ if callable(v) else None,
)
def test_a_manifest_the_schema_refuses_is_failed_and_the_good_version_serves(
    tmp_path: Path, change: dict[str, Any] | Callable[[Path], None], message: str
) -> None:
    repository = tmp_path / "models"
    make_version(repository, "m", 1)

    async def body(repo: ModelRepository) -> None:
        bad = make_version(repository, "m", 2, seed=1)
        change(bad) if callable(change) else edit_manifest(bad, **change)
        [event] = await repo.reconcile()
        entry = repo.models["m"].versions[2]
        assert (event.action, entry.state) == ("refused", State.FAILED), entry.reason
        assert "manifest.json" in entry.reason
        assert message in entry.reason, entry.reason
        assert repo.get().version == 1
        assert (await repo.get().classify(["good film"])).probabilities.shape == (1, 2)
        assert await repo.reconcile() == []  # refused once, not at every poll

    metrics = run(repository, body)
    assert failures(metrics, "invalid_manifest") == 1


def test_a_manifest_over_its_size_cap_is_refused_unread(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    make_version(repository, "m", 1)

    async def body(repo: ModelRepository) -> None:
        bad = make_version(repository, "m", 2, seed=1)
        with open(bad / "manifest.json", "r+b") as fh:
            fh.truncate(artifact.MAX_FILE_BYTES["manifest.json"] + 1)  # sparse: NULs
        await repo.reconcile()
        entry = repo.models["m"].versions[2]
        assert entry.state is State.FAILED and "over the 1048576-byte cap" in entry.reason

    metrics = run(repository, body)
    assert failures(metrics, "unsafe_file") == 1


# -- the files -----------------------------------------------------------------------------------


@pytest.mark.parametrize("absolute", [False, True], ids=["dotdot", "absolute"])
def test_a_sha256_key_naming_a_path_is_refused_and_not_read(
    tmp_path: Path, sentinel: Path, absolute: bool
) -> None:
    repository = tmp_path / "models"
    make_version(repository, "m", 1)
    key = str(sentinel) if absolute else "../../../outside/secret"

    async def body(repo: ModelRepository) -> None:
        bad = make_version(repository, "m", 2, seed=1)
        assert (bad / key).resolve() == sentinel.resolve()
        sha = json.loads((bad / "manifest.json").read_text())["sha256"]
        edit_manifest(bad, sha256={**sha, key: sha256_file(sentinel)})  # the right hash
        _OPENED.clear()  # sha256_file above opened it on purpose
        await repo.reconcile()
        entry = repo.models["m"].versions[2]
        assert entry.state is State.FAILED and "Additional properties" in entry.reason
        assert repo.get().version == 1

    metrics = run(repository, body)
    assert failures(metrics, "invalid_manifest") == 1


def test_a_model_that_is_a_symlink_out_of_the_repository_is_refused(
    tmp_path: Path, sentinel: Path
) -> None:
    repository = tmp_path / "models"
    make_version(repository, "m", 1)

    async def body(repo: ModelRepository) -> None:
        bad = make_version(repository, "m", 2, seed=1)
        shutil.copy(bad / MODEL_FILE, sentinel)  # the very model, so its hash matches
        _OPENED.clear()  # written here on purpose
        (bad / MODEL_FILE).unlink()
        (bad / MODEL_FILE).symlink_to(sentinel)
        await repo.reconcile()
        entry = repo.models["m"].versions[2]
        assert entry.state is State.FAILED and "model.onnx is a symbolic link" in entry.reason
        assert repo.get().version == 1

    metrics = run(repository, body)
    assert failures(metrics, "unsafe_file") == 1


def test_a_version_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    make_version(repository, "m", 1)
    elsewhere = make_version(tmp_path / "elsewhere", "m", 2, seed=1)

    async def body(repo: ModelRepository) -> None:
        (repository / "m" / "2").symlink_to(elsewhere, target_is_directory=True)
        await repo.reconcile()
        entry = repo.models["m"].versions[2]
        assert entry.state is State.FAILED and "is a symbolic link" in entry.reason

    metrics = run(repository, body)
    assert failures(metrics, "unsafe_file") == 1


def test_a_model_over_its_size_cap_is_refused_without_reading_it(
    tmp_path: Path, sentinel: Path
) -> None:
    """A 5 GiB sparse model.onnx (default cap 4 GiB): refused from its size, before a byte is
    read (the code before hashed all of it, 40 GB for 37-77 s, holding the repository)."""
    repository = tmp_path / "models"
    make_version(repository, "m", 1)

    async def body(repo: ModelRepository) -> None:
        bad = make_version(repository, "m", 2, seed=1)
        with open(bad / MODEL_FILE, "r+b") as fh:
            fh.truncate(5 << 30)
        _WATCHED.add(str(bad / MODEL_FILE))  # reading it counts as an open seen
        _WATCHED.add(MODEL_FILE)  # opened relative to the version directory
        try:
            await repo.reconcile()
        finally:
            _WATCHED.difference_update({str(bad / MODEL_FILE), MODEL_FILE})
        entry = repo.models["m"].versions[2]
        assert entry.state is State.FAILED, entry.reason
        assert "over the 4294967296-byte cap for model.onnx" in entry.reason
        _OPENED.clear()  # opened (to fstat it), never read: the size decides

    metrics = run(repository, body)
    assert failures(metrics, "unsafe_file") == 1


def test_a_fifo_is_not_a_regular_file(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    make_version(repository, "m", 1)

    async def body(repo: ModelRepository) -> None:
        bad = make_version(repository, "m", 2, seed=1)
        (bad / TOKENIZER_FILE).unlink()
        os.mkfifo(bad / TOKENIZER_FILE)  # opening it for reading would block
        await repo.reconcile()
        entry = repo.models["m"].versions[2]
        assert entry.state is State.FAILED and "is not a regular file" in entry.reason

    run(repository, body)


# -- any failure refuses the version, never the server ----------------------------------------


def test_an_unforeseen_error_refuses_the_version_not_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository = tmp_path / "models"
    make_version(repository, "m", 1)
    make_version(repository, "m", 2, seed=1)
    real = core.load_version_dir

    def load(path: Path, *args: Any, **kwargs: Any) -> Any:
        if path.name == "2":
            raise ZeroDivisionError("a check nobody foresaw")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(core, "load_version_dir", load)

    async def body(repo: ModelRepository) -> None:
        entry = repo.models["m"].versions[2]
        assert entry.state is State.FAILED
        assert entry.reason == "unexpected ZeroDivisionError: a check nobody foresaw"
        assert repo.get().version == 1

    metrics = run(repository, body)  # at startup: serves 1 instead of exiting
    assert failures(metrics, "other") == 1


def test_startup_with_bad_versions_beside_a_good_one_serves_the_good_one(
    tmp_path: Path, sentinel: Path
) -> None:
    repository = tmp_path / "models"
    make_version(repository, "m", 1)
    edit_manifest(make_version(repository, "m", 2, seed=1), labels=[{}, {}])  # crashed the scan
    deep_manifest(make_version(repository, "m", 3, seed=1))  # RecursionError
    good_copy(repository, "²")  # ValueError in the scan
    edit_manifest(good_copy(repository, "9" * 23), version=int("9" * 23))  # was served
    make_version(repository, "evil", 1)
    edit_manifest(repository / "evil" / "1", labels=[0, 1])  # was served, then INTERNAL

    async def body(repo: ModelRepository) -> None:
        assert repo.get("m").version == 1
        states = {v: e.state for v, e in repo.models["m"].versions.items()}
        assert states == {1: State.READY, 2: State.FAILED, 3: State.FAILED}
        assert repo.models["evil"].versions[1].state is State.FAILED
        assert ready_models(repo) == ["m"]

    metrics = run(repository, body)
    assert failures(metrics, "invalid_manifest") == 2
    assert failures(metrics, "invalid_manifest", model="evil") == 1


# -- the lock ------------------------------------------------------------------------------------


def test_a_slow_load_holds_up_neither_admin_calls_nor_other_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository = tmp_path / "models"
    make_version(repository, "a", 1)
    make_version(repository, "b", 1)
    gate = threading.Event()
    entered = threading.Event()
    real = core.load_version_dir

    def load(path: Path, *args: Any, **kwargs: Any) -> Any:
        if path.parent.name == "a" and path.name == "2":
            entered.set()
            gate.wait(120)  # a 40 GB hash, a hung mount...
        return real(path, *args, **kwargs)

    monkeypatch.setattr(core, "load_version_dir", load)

    async def body(repo: ModelRepository) -> None:
        make_version(repository, "a", 2, seed=1)
        make_version(repository, "b", 2, seed=1)
        slow = asyncio.create_task(repo.reconcile(["a"]))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 60)
        try:
            # Deadlock guards, not timings: before, each of these waited for the gate.
            events = await asyncio.wait_for(repo.reconcile(["b"]), 60)
            assert [(e.model, e.version, e.action) for e in events] == [
                ("b", 2, "loaded"), ("b", 1, "unloaded"),
            ]  # fmt: skip
            await asyncio.wait_for(repo.unload_model("b", 2), 60)
            await asyncio.wait_for(repo.load_model("b", 2), 60)
            assert repo.models["a"].versions[2].state is State.LOADING
            assert repo.get("a").version == 1  # the old version serves meanwhile
        finally:
            gate.set()
        events = await slow
        assert [(e.model, e.version, e.action) for e in events] == [
            ("a", 2, "loaded"), ("a", 1, "unloaded"),
        ]  # fmt: skip

    run(repository, body)
