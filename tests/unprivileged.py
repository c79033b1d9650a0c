"""Run code as an unprivileged user, so permission tests hold when the suite runs as root (CI).

Root ignores permission bits; these helpers run the code under test in a fresh (spawned)
process that, when it is root, gives up its identity for `nobody`'s (setgroups, setgid,
setuid: for good, the kernel then checks the bits as for any user) at the point the caller
names. As any other user nothing changes: the bits already apply.
"""

from __future__ import annotations

import multiprocessing
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path


def unprivileged_ids() -> tuple[int, int]:
    """(uid, gid) the code under test runs as: nobody's as root, else one's own."""
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    nobody = pwd.getpwnam("nobody")
    return nobody.pw_uid, nobody.pw_gid


def drop_privileges() -> None:
    """Become `nobody` for good if root (no-op otherwise)."""
    if os.geteuid() == 0:
        uid, gid = unprivileged_ids()
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        assert os.geteuid() == uid and os.getegid() == gid


@contextmanager
def shared_dir() -> Iterator[Path]:
    """A folder the unprivileged user can reach and owns (pytest's tmp_path is root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="textserve-unprivileged-"))
    try:
        path.chmod(0o755)
        os.chown(path, *unprivileged_ids())
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _export(run_dir: Path, repository: Path, name: str) -> str:
    """export_run, loading the run as the caller and writing the repository unprivileged;
    the ExportError's message, or '' if it published."""
    from textserve.export import pipeline, run_source
    from textserve.export.errors import ExportError

    load = run_source.open_run

    def load_then_drop(*args: object, **kwargs: object) -> object:
        run = load(*args, **kwargs)  # type: ignore[arg-type]
        drop_privileges()
        probe = repository / ".probe"  # the user can write where it may: the drop is no block
        probe.write_text("x")
        probe.unlink()
        return run

    run_source.open_run = load_then_drop  # type: ignore[assignment]
    try:
        pipeline.export_run(run_dir, repository, name, threads=1)
    except ExportError as exc:
        return str(exc)
    return ""


def export_unprivileged(run_dir: Path, repository: Path, name: str) -> str:
    """`_export` in a spawned process: a fork of a process that ran torch can hang."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_export, run_dir, repository, name).result(timeout=240)
