"""engine/memory.py: malloc's thresholds pinned at a serving process's start and malloc_trim
after a retired version, on glibc; nothing elsewhere."""

from __future__ import annotations

import asyncio
import ctypes
import os
import platform
import subprocess
import sys
from typing import Any, cast

import pytest

from textserve.service import server
from textserve.service.config import ServerConfig
from textserve.service.engine import memory

GLIBC = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")

# A version's life in the memory of a thread other than the main one (the loader's, the
# inference thread's), in a fresh process: a 16 MiB buffer freed once read (the model file's
# bytes; glibc, when not pinned, raises its mmap threshold to its size and its trim threshold
# to twice it), then the version's weights (1 MiB blocks) and buffers (64 KiB blocks), all freed
# at retirement, then release_freed_memory() as the repository calls it. Prints the growth of
# the resident size in KiB.
VERSION_LIFE = """
import ctypes, sys, threading
from textserve import procfs
from textserve.service.engine import memory

if sys.argv[1] == "pinned":
    assert memory.pin_malloc_thresholds()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
MiB = 1 << 20

def load_and_retire():
    model = libc.malloc(16 * MiB)
    ctypes.memset(model, 1, 16 * MiB)
    libc.free(model)
    sizes = [MiB] * 12 + [64 * 1024] * 192
    blocks = [libc.malloc(size) for size in sizes]
    for block, size in zip(blocks, sizes):
        ctypes.memset(block, 1, size)
    for block in blocks:
        libc.free(block)

before = procfs.status_number("self", "VmRSS")
thread = threading.Thread(target=load_and_retire)
thread.start()
thread.join()
memory.release_freed_memory()
print(procfs.status_number("self", "VmRSS") - before)
"""


def _growth_kib(mode: str) -> int:
    env = {k: v for k, v in os.environ.items()
           if k not in memory.MALLOC_ENVIRONMENT and k != "GLIBC_TUNABLES"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", VERSION_LIFE, mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return int(done.stdout.strip().splitlines()[-1])


@GLIBC
def test_a_retired_versions_memory_goes_back_with_pinned_thresholds() -> None:
    # 24 MiB were touched and freed; what stays is the arena's bookkeeping and a few pages
    assert _growth_kib("pinned") < 4 * 1024


@GLIBC
def test_without_the_pin_glibc_keeps_a_retired_versions_memory() -> None:
    """The cause the pin removes, shown on this glibc: the freed blocks join the top chunk of
    the thread's arena, which free() keeps below the raised trim threshold and malloc_trim()
    never returns. Should a glibc return it, this fails and the pin may be let go."""
    assert _growth_kib("default") > 16 * 1024


def test_the_environments_thresholds_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576")
    assert memory.pin_malloc_thresholds() is False
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")
    assert memory.pin_malloc_thresholds() is False


class _Created(Exception):
    pass


def test_serve_pins_the_thresholds_before_any_model_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []

    def create_server(*args: Any, **kwargs: Any) -> Any:
        calls.append("create_server")  # builds the repository, which loads the models
        raise _Created

    monkeypatch.setattr(server, "pin_malloc_thresholds", lambda: calls.append("pin"))
    monkeypatch.setattr(server, "create_server", create_server)
    with pytest.raises(_Created):
        asyncio.run(server.serve(cast(ServerConfig, None)))
    assert calls == ["pin", "create_server"]


@GLIBC
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
    assert memory.pin_malloc_thresholds() is False
