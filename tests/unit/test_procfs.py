"""textserve/procfs.py, the one /proc reader, against this very process and a child of it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from textserve import procfs

GONE = 2**22 + 12345  # above Linux's pid_max: never a process


def test_this_process_as_proc_shows_it() -> None:
    stat = procfs.process_stat("self")
    assert stat is not None and stat.ppid == os.getppid()
    assert stat.cpu_seconds > 0 and stat.rss_bytes > 0
    assert procfs.process_stat(os.getpid()).start == stat.start  # type: ignore[union-attr]
    rss = procfs.status_number("self", "VmRSS")
    assert rss is not None and abs(rss * 1024 - stat.rss_bytes) < 64 * 2**20
    assert (procfs.status_number("self", "Threads") or 0) >= 1
    assert (procfs.open_fds("self") or 0) >= 3
    assert os.getpid() in set(procfs.pids())
    assert procfs.cmdline(os.getpid())[0] == sys.executable or procfs.cmdline(os.getpid())


def test_a_gone_process_is_none_never_an_error() -> None:
    assert procfs.process_stat(GONE) is None
    assert procfs.tree_cpu_seconds(GONE) is None
    assert procfs.status_number(GONE, "VmRSS") is None
    assert procfs.open_fds(GONE) is None and procfs.cmdline(GONE) == []


def test_the_tree_counts_a_busy_child() -> None:
    burn = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"
    child = subprocess.Popen([sys.executable, "-c", burn + "time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            child_stat = procfs.process_stat(child.pid)
            if child_stat is not None and child_stat.cpu_seconds >= 0.4:
                break
            time.sleep(0.1)
        assert child.pid in procfs.descendants(os.getpid())
        own = procfs.process_stat(os.getpid())
        tree = procfs.tree_cpu_seconds(os.getpid())
        assert own is not None and tree is not None and tree - own.cpu_seconds >= 0.4
    finally:
        child.kill()
        child.wait()


def test_machine_figures() -> None:
    busy, total = procfs.machine_jiffies() or (0, 0)
    assert 0 < busy <= total
    assert (procfs.meminfo_bytes("MemTotal") or 0) > 2**20
    assert procfs.meminfo_bytes("NoSuchField") is None
    assert procfs.cpu_model() is None or isinstance(procfs.cpu_model(), str)
    with pytest.raises(ValueError):
        procfs.parse_cpu_line("intr 1 2 3")
