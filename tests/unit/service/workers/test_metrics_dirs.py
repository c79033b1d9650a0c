"""The supervisor's multiprocess metrics folders: a folder whose supervisor is gone is
removed at the next start; a live server's, one without an owner, or a reused pid's are
judged by pid and start time."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from textserve.service.workers.metrics import (
    OWNER_FILE,
    _start_time,
    create_metrics_dir,
    remove_stale_metrics_dirs,
)


def folder(parent: Path, name: str, owner: str | None) -> Path:
    path = parent / f"textserve-metrics-{name}"
    path.mkdir()
    (path / "counter_1.db").write_bytes(b"\0" * 8)
    if owner is not None:
        (path / OWNER_FILE).write_text(owner)
    return path


def test_only_the_folders_of_servers_that_are_gone_are_removed(tmp_path: Path) -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()
    me = os.getpid()
    dead = folder(tmp_path, "dead", f"{ended.pid} 12345")
    reused = folder(tmp_path, "reused", f"{me} 1")  # this pid, another process's start time
    live = folder(tmp_path, "live", f"{me} {_start_time(me)}")
    unowned = folder(tmp_path, "unowned", None)
    garbled = folder(tmp_path, "garbled", "not a pid")
    assert sorted(remove_stale_metrics_dirs(str(tmp_path))) == sorted([dead, reused])
    assert live.is_dir() and unowned.is_dir() and garbled.is_dir()


def test_a_new_folder_names_its_owner_and_clears_stale_ones(tmp_path: Path) -> None:
    stale = folder(tmp_path, "stale", "999999999 1")
    created = Path(create_metrics_dir(str(tmp_path)))
    assert not stale.exists()
    pid, started = (created / OWNER_FILE).read_text().split()
    assert int(pid) == os.getpid() and started == _start_time(os.getpid())
    assert remove_stale_metrics_dirs(str(tmp_path)) == []  # ours: alive
