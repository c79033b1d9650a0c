"""publish(): atomic and durable. The order of its writes (files, manifest last, fsync of each
file and of the folder, rename, fsync of the parent) recorded through wrappers around the real
os functions, and readers that never see part of a version: one scanning at every step of a
publish, one in a thread scanning all the time while versions are published."""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.handmade import make_version
from textserve.artifact import MANIFEST_FILE, Manifest, parse_version, read_version, sha256_file
from textserve.export import publish


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A whole version (model.onnx, tokenizer.json, manifest.json) to publish copies of."""
    return make_version(tmp_path / "source", "m", 1)


def staged(source: Path, model_dir: Path) -> tuple[Path, Manifest]:
    """A temp dir holding the version's files, as an export leaves them before publish()."""
    tmp = publish.make_temp_dir(model_dir)
    for path in source.iterdir():
        if path.name != MANIFEST_FILE:
            shutil.copyfile(path, tmp / path.name)
    return tmp, Manifest.read(source)


def partial_versions(model_dir: Path) -> list[str]:
    """What a reader of the repository sees that is not a whole version (the server's check)."""
    bad = []
    for path in sorted(model_dir.iterdir()):
        if parse_version(path.name) is None:
            continue  # a temp dir: no reader takes it for a version
        try:
            read_version(path)
        except (OSError, ValueError) as exc:
            bad.append(f"{path.name}: {exc}")
    return bad


def test_files_then_manifest_then_fsyncs_then_rename_then_the_parent(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = tmp_path / "models" / "m"
    tmp, manifest = staged(source, model_dir)
    events: list[tuple[str, str]] = []
    real_fsync, real_rename, real_write = os.fsync, os.rename, Manifest.write

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src: Any, dst: Any) -> None:
        events.append(("rename", f"{src} -> {dst}"))
        real_rename(src, dst)

    def write(self: Manifest, version_dir: Path) -> None:
        # manifest last: every file it names is already there, whole, when it is written
        for name, digest in self.sha256.items():
            assert sha256_file(version_dir / name) == digest, name
        events.append(("manifest", str(version_dir / MANIFEST_FILE)))
        real_write(self, version_dir)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(Manifest, "write", write)
    target = publish.publish(tmp, model_dir, manifest)

    assert target == model_dir / "1"
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "manifest" and kinds.count("manifest") == 1
    renamed = kinds.index("rename")
    assert kinds.count("rename") == 1 and events[renamed][1] == f"{tmp} -> {target}"
    synced_before = {path for kind, path in events[:renamed] if kind == "fsync"}
    # every file (the manifest too) and the folder itself are on disk before the rename
    assert synced_before == {str(tmp / p.name) for p in target.iterdir()} | {str(tmp)}
    # and the rename itself is made durable: the parent folder is synced after it
    assert events[renamed + 1 :] == [("fsync", str(model_dir))]
    assert read_version(target)[0].version == 1


def test_a_reader_at_every_step_of_a_publish_sees_no_version_or_a_whole_one(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = tmp_path / "models" / "m"
    seen: list[list[str]] = []

    def scanning(real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            seen.append(partial_versions(model_dir))
            result = real(*args, **kwargs)
            seen.append(partial_versions(model_dir))
            return result

        return wrapper

    for name in ("fsync", "rename", "chmod"):
        monkeypatch.setattr(os, name, scanning(getattr(os, name)))
    monkeypatch.setattr(Manifest, "write", scanning(Manifest.write))
    for version in (1, 2, 3):
        tmp, manifest = staged(source, model_dir)
        assert publish.publish(tmp, model_dir, manifest) == model_dir / str(version)
    assert len(seen) > 30 and all(bad == [] for bad in seen), seen
    assert [p.name for p in sorted(model_dir.iterdir())] == ["1", "2", "3"]


def test_a_concurrent_reader_never_sees_part_of_a_version(source: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "models" / "m"
    model_dir.mkdir(parents=True)
    # a bigger model file: writing and hashing it takes long enough to be caught in between
    with open(source / "model.onnx", "ab") as fh:
        fh.write(os.urandom(1 << 20))
    manifest = Manifest.read(source)
    sha256 = {**manifest.sha256, "model.onnx": sha256_file(source / "model.onnx")}
    dataclasses.replace(manifest, sha256=sha256).write(source)
    stop = threading.Event()
    scans: list[int] = []
    partial: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            partial.extend(partial_versions(model_dir))
            scans.append(len([p for p in model_dir.iterdir() if parse_version(p.name)]))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        for _ in range(10):
            tmp, manifest = staged(source, model_dir)
            publish.publish(tmp, model_dir, manifest)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert partial == []
    assert len(scans) > 10 and scans == sorted(scans)  # it read while versions came
    assert scans[-1] == 10


def test_the_temp_dir_is_hidden_in_the_model_folder_and_names_its_process(tmp_path: Path) -> None:
    model_dir = tmp_path / "models" / "m"
    tmp = publish.make_temp_dir(model_dir)
    assert tmp.parent == model_dir and tmp.is_dir()
    assert tmp.name.startswith(f".tmp-{os.getpid()}-")
    assert parse_version(tmp.name) is None


def test_an_unwritable_repository_says_where_and_why(tmp_path: Path) -> None:
    blocker = tmp_path / "models"
    blocker.write_text("a file")
    with pytest.raises(publish.ExportError) as info:
        publish.make_temp_dir(blocker / "m")
    assert (
        str(info.value) == f"cannot write to the model repository {blocker / 'm'}: Not a directory"
    )


def test_stale_temp_dirs_are_removed_with_a_log_line_and_errors_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    stale = tmp_path / ".tmp-999999999-x"  # no such process
    (stale / "sub").mkdir(parents=True)
    real_rmtree = shutil.rmtree

    def rmtree(path: Any, ignore_errors: bool = False) -> None:
        real_rmtree(path)
        if not ignore_errors:  # a leftover another user's process still holds, say
            raise OSError("could not remove everything")

    monkeypatch.setattr(publish.shutil, "rmtree", rmtree)
    with caplog.at_level("INFO", logger=publish.__name__):
        publish.remove_stale_temp_dirs(tmp_path)
    assert not stale.exists()
    assert [r.getMessage() for r in caplog.records] == [
        f"removing {stale}, left by an export that did not finish"
    ]


def test_a_temp_dir_of_a_process_of_another_user_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = tmp_path / ".tmp-4242-x"
    theirs.mkdir()

    def kill(pid: int, signal: int) -> None:
        raise PermissionError(1, "Operation not permitted")  # alive, not ours to signal

    monkeypatch.setattr(publish.os, "kill", kill)
    publish.remove_stale_temp_dirs(tmp_path)
    assert theirs.exists()


def test_no_free_version_number_is_an_export_error(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = tmp_path / "models" / "m"
    tmp, manifest = staged(source, model_dir)

    def rename(src: Any, dst: Any) -> None:
        raise OSError(errno.EEXIST, "File exists")  # every number taken by another export

    monkeypatch.setattr(publish.os, "rename", rename)
    with pytest.raises(publish.ExportError) as info:
        publish.publish(tmp, model_dir, manifest)
    assert str(info.value) == f"could not find a free version number in {model_dir}"
