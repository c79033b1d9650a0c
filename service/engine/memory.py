"""Give the memory of a retired version back to the operating system.

onnxruntime frees a session's arena and weights into the C allocator when the session goes,
but glibc's malloc keeps freed pages for reuse, so a worker's resident size climbed in steps
at each hot reload of a 14 MB model (`make soak`: +25 to +33 MiB per reload in one worker)
though nothing leaked. `malloc_trim(0)` returns the free pages at the top of every heap and
arena; it is called once a retired version's handle is dropped, off the event loop. On a libc
without it (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
from functools import cache
from typing import Any

from textserve import procfs

logger = logging.getLogger(__name__)


@cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def _rss_kib() -> int | None:
    return procfs.status_number("self", "VmRSS")


def release_freed_memory() -> int | None:
    """Collect cycles (a session held only by a cycle goes now), then malloc_trim(0); the KiB
    of resident memory that went back, or None where there is no malloc_trim."""
    gc.collect()
    libc = _libc()
    if libc is None:
        return None
    before = _rss_kib()
    libc.malloc_trim(0)
    after = _rss_kib()
    released = None if before is None or after is None else max(0, before - after)
    logger.debug("malloc_trim: %s KiB returned to the system", released)
    return released
