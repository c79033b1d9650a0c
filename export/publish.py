"""Atomic, versioned writes into the model repository: models/<name>/<N>/.

A version is built in models/<name>/.tmp-<pid>-XXXX/ and renamed into place with rename(2)
once complete, so readers see no version or a whole one; its number is
textserve.artifact.next_version's, by the rule the server's scan reads versions with. A temp
dir whose process is gone (killed before it could clean up) is removed by the next export of
that model.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from textserve.artifact import Manifest, ManifestError, next_version, version_dir
from textserve.export.errors import ExportError

logger = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp-"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_name(name: str) -> None:
    """ExportError unless `name` may be a model name (a directory of the repository)."""
    if not NAME_PATTERN.match(name):
        raise ExportError(
            f"model name {name!r} must be letters, digits, '.', '_' or '-' "
            "(at most 128, not starting with '.', '_' or '-')"
        )


@contextmanager
def staged_version(model_dir: Path) -> Iterator[Path]:
    """A temporary directory of `model_dir` to build a version in (make_temp_dir), removed if
    the block fails; an OSError in the block becomes one ExportError saying nothing was
    published. Every source's export publishes through it."""
    tmp = make_temp_dir(model_dir)
    try:
        yield tmp
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise ExportError(
                f"writing to {model_dir} failed: {exc.strerror or exc}; nothing was published"
            ) from exc
        raise


def make_temp_dir(model_dir: Path) -> Path:
    """models/<name>/.tmp-<pid>-XXXX/ (created with its parents); ExportError if unwritable."""
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temp_dirs(model_dir)
        return Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", dir=model_dir))
    except OSError as exc:
        raise ExportError(
            f"cannot write to the model repository {model_dir}: {exc.strerror or exc}"
        ) from None


def remove_stale_temp_dirs(model_dir: Path) -> None:
    """Remove temp dirs of exports whose process is gone (killed before it could clean up)."""
    for path in model_dir.glob(f"{TEMP_PREFIX}*"):
        match = re.match(rf"^{re.escape(TEMP_PREFIX)}(\d+)-", path.name)
        if match and path.is_dir() and not _pid_alive(int(match.group(1))):
            logger.info("removing %s, left by an export that did not finish", path)
            shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def publish(tmp: Path, model_dir: Path, manifest: Manifest) -> Path:
    """Write the manifest last, flush everything to disk, rename tmp to the next free version."""
    for _ in range(1000):
        try:
            version = next_version(model_dir)  # textserve.artifact's rule, as the server's scan
        except ManifestError as exc:
            raise ExportError(str(exc)) from None
        final = dataclasses.replace(manifest, version=version)
        try:
            final.check()  # what the exporter publishes is what the server accepts
        except ManifestError as exc:
            raise ExportError(f"the manifest would not pass its schema: {exc}") from None
        final.write(tmp)
        _fsync_tree(tmp)
        # mkdtemp makes the directory 0700; a version must be readable like any other model
        # file (the server may run as another user). Not umask-derived: reading the umask
        # means setting it, which races with other threads creating files.
        os.chmod(tmp, 0o755)
        target = version_dir(model_dir, version)
        try:
            # rename(2) is atomic: readers see no version or a complete one. It fails on an
            # existing non-empty directory: another export took that number, so try the next.
            os.rename(tmp, target)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                continue
            raise
        _fsync_dir(model_dir)
        return target
    raise ExportError(f"could not find a free version number in {model_dir}")


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
