"""Tests' witness that nothing outside a model repository is opened: a process-wide audit hook
on the "open" event (Python's open, os.open, io.open; what C libraries open themselves is not
seen, which is why the server reads a version's bytes in Python and hands them over).

    WATCHED.add(str(sentinel)); OPENED.clear(); ...; assert not OPENED

sys.addaudithook cannot be undone, so there is one hook, installed on import, doing nothing
while nothing is watched.
"""

from __future__ import annotations

import os
import sys
from typing import Any

WATCHED: set[str] = set()  # real paths (symlinks resolved) whose opening is recorded
OPENED: list[str] = []  # what was opened of them, as the caller named it


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not WATCHED or not isinstance(args[0], str | bytes | os.PathLike):
        return
    path = os.fsdecode(args[0])
    flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
    if flags & os.O_NOFOLLOW and os.path.islink(path):
        return  # refused by the kernel (ELOOP): nothing behind the link is opened
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return
    if path in WATCHED or real in WATCHED:
        OPENED.append(path)


sys.addaudithook(_audit)
