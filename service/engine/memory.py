"""Give the memory of a retired version back to the operating system.

onnxruntime frees a session's arena and weights into the C allocator when the session goes,
but glibc's malloc keeps freed pages for reuse, so a worker's resident size climbed in steps
at each hot reload of a 14 MB model (`make soak`: +25 to +33 MiB per reload in one worker)
though nothing leaked. Two things hand it back:

- `pin_malloc_thresholds()`, once at the start of a serving process, before any model loads:
  glibc's mmap and trim thresholds fixed at 128 KiB. By default glibc raises both when a
  block it had mmapped is freed (the mmap threshold to that block's size, the trim threshold
  to twice it), so once the first 14 MB buffer of a load is freed, a version's weights come
  from the malloc arena of the thread that loaded them, and what a retired version frees there
  joins the arena's top chunk. For the arena of any thread but the main one, free() gives that
  top back only past the trim threshold (~28 MiB by then) and malloc_trim() never does (it
  returns free pages inside a heap, and the top of the main arena only): a worker kept 10-20
  MiB of a retired session resident, more or less at each reload as versions alternated
  between the heaps (probe: malloc's in-use bytes flat at ~52 MiB over 16 reloads, the arena
  heaps' resident size between 38 and 53 MiB). Pinned, a version's large blocks are mmapped
  and unmapped when freed, and an arena's top goes back past 128 KiB. Skipped when the
  environment sets malloc's thresholds itself (MALLOC_*_ variables, glibc.malloc tunables).
- `release_freed_memory()`, once a retired version's handle is dropped, off the event loop:
  `malloc_trim(0)` returns the free pages inside every heap and arena (freed blocks that
  live ones still surround).

On a libc without them (musl, macOS) both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
from functools import cache
from typing import Any

from textserve import procfs

logger = logging.getLogger(__name__)

# mallopt(3) parameters (glibc's malloc.h) and the value both thresholds are pinned at: glibc's
# own starting value of each, which it would otherwise raise as the process runs.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
PINNED_THRESHOLD = 128 * 1024
# Where a user or a deployment sets malloc's thresholds: theirs win.
MALLOC_ENVIRONMENT = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)


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


def _thresholds_set_by_environment() -> bool:
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return "glibc.malloc." in tunables or any(name in os.environ for name in MALLOC_ENVIRONMENT)


def pin_malloc_thresholds(threshold: int = PINNED_THRESHOLD) -> bool:
    """Fix glibc's mmap and trim thresholds at `threshold` bytes for this process (see the
    module docstring); call it before the first model loads. Whether they were pinned: False
    on a libc without mallopt, or when the environment sets malloc's thresholds."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt") or _thresholds_set_by_environment():
        return False
    pinned = bool(libc.mallopt(M_MMAP_THRESHOLD, threshold)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, threshold)
    )
    logger.debug("malloc thresholds pinned at %d bytes: %s", threshold, pinned)
    return pinned


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
