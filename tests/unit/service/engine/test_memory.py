"""engine/memory.py: malloc_trim after a retired version, on glibc; nothing elsewhere."""

from __future__ import annotations

import ctypes
import platform

import pytest

from textserve.service.engine import memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_pages_go_back_to_the_system_on_glibc() -> None:
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    # 64 MiB in 32 KiB blocks (below glibc's mmap threshold: from the heap), every other block
    # kept so the freed ones are holes the automatic trim of the heap's top cannot return
    blocks = [libc.malloc(32 * 1024) for _ in range(2048)]
    for block in blocks:
        ctypes.memset(block, 1, 32 * 1024)  # touched: resident
    for block in blocks[::2]:
        libc.free(block)
    released = memory.release_freed_memory()
    for block in blocks[1::2]:
        libc.free(block)
    assert released is not None and released >= 16 * 1024, released  # KiB: most of 32 MiB


def test_without_malloc_trim_nothing_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_libc", lambda: None)
    assert memory.release_freed_memory() is None
