"""The one reader of Linux's /proc: process CPU, memory and start time, the process tree, the
machine's CPU counters, memory and CPU model. Every function answers None (or nothing) where
there is no /proc or the process is gone, never raises for that.

    stat = process_stat(pid)              # ProcessStat(ppid, cpu_seconds, rss_bytes, start)
    tree_cpu_seconds(pid)                 # the process and its live descendants
    thread_cpu_seconds(pid)               # {tid: (its name, its CPU seconds)}
    status_number("self", "VmRSS")        # a /proc/PID/status field's number (VmRSS: KiB)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGESIZE") if hasattr(os, "sysconf") else 4096


class ProcessStat(NamedTuple):
    ppid: int
    cpu_seconds: float  # user + system
    rss_bytes: int
    start: str  # clock ticks since boot at its start: with the pid, one process for good


def _stat(path: Path) -> tuple[str, list[bytes]] | None:
    """A stat file (/proc/PID/stat, /proc/PID/task/TID/stat): the command, and the fields after
    it (the command may hold spaces and parentheses: state is field 3, ppid 4, utime 14, stime
    15, starttime 22, rss 24 in man 5 proc, so 0, 1, 11, 12, 19, 21 here); None when gone."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    head, _, tail = raw.rpartition(b")")
    return head.partition(b"(")[2].decode(errors="replace"), tail.split()


def process_stat(pid: int | str) -> ProcessStat | None:
    """/proc/PID/stat (pid or "self"); None when there is no such process."""
    stat = _stat(PROC / str(pid) / "stat")
    if stat is None:
        return None
    fields = stat[1]
    try:
        return ProcessStat(
            int(fields[1]),
            (int(fields[11]) + int(fields[12])) / _TICK,
            int(fields[21]) * _PAGE,
            fields[19].decode(),
        )
    except (IndexError, ValueError):
        return None


def thread_cpu_seconds(pid: int | str) -> dict[int, tuple[str, float]]:
    """Each thread of the process: {tid: (its name as the kernel has it, user + system CPU
    seconds)}; empty when the process is gone."""
    threads: dict[int, tuple[str, float]] = {}
    try:
        tids = [int(tid) for tid in os.listdir(PROC / str(pid) / "task")]
    except (OSError, ValueError):
        return threads
    for tid in tids:
        stat = _stat(PROC / str(pid) / "task" / str(tid) / "stat")
        if stat is None:
            continue  # ended meanwhile
        name, fields = stat
        try:
            threads[tid] = (name, (int(fields[11]) + int(fields[12])) / _TICK)
        except (IndexError, ValueError):
            continue
    return threads


def pids() -> Iterator[int]:
    """Every process id /proc lists now."""
    try:
        entries = os.listdir(PROC)
    except OSError:
        return
    for entry in entries:
        if entry.isdigit():
            yield int(entry)


def descendants(pid: int) -> list[int]:
    """The live processes below `pid` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for other in pids():
        stat = process_stat(other)
        if stat is not None:
            children.setdefault(stat.ppid, []).append(other)
    found, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, ()))
    return found


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of `pid` and its live descendants (an engine process, workers)."""
    own = process_stat(pid)
    if own is None:
        return None
    return own.cpu_seconds + sum(
        stat.cpu_seconds for child in descendants(pid) if (stat := process_stat(child))
    )


def status_number(pid: int | str, field: str) -> int | None:
    """The number of a /proc/PID/status field: VmRSS, VmHWM, ... (in KiB), Threads, ..."""
    try:
        with open(PROC / str(pid) / "status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def open_fds(pid: int | str) -> int | None:
    try:
        return len(os.listdir(PROC / str(pid) / "fd"))
    except OSError:
        return None


def cmdline(pid: int | str) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def machine_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot (/proc/stat); idle and iowait are not busy."""
    try:
        with open(PROC / "stat", encoding="ascii") as fh:
            return parse_cpu_line(fh.readline())
    except (OSError, ValueError):
        return None


def parse_cpu_line(line: str) -> tuple[int, int]:
    """(busy, total) of /proc/stat's first line (or the whole text); idle and iowait are not
    busy; guest time is in user time already.

    >>> parse_cpu_line("cpu  100 0 50 800 50 0 0 0 0 0\\ncpu0 ...")
    (150, 1000)
    """
    parts = line.split("\n", 1)[0].split()
    if not parts or parts[0] != "cpu":
        raise ValueError("not /proc/stat: its first line starts with 'cpu'")
    values = [int(v) for v in parts[1:9]]  # user nice system idle iowait irq softirq steal
    total = sum(values)
    return total - values[3] - values[4], total


def meminfo_bytes(field: str) -> int | None:
    """A /proc/meminfo field (MemAvailable, MemTotal, ...) in bytes."""
    try:
        for line in (PROC / "meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo), e.g. 'AMD EPYC 7B13'."""
    try:
        for line in (PROC / "cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return None
