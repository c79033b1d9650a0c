"""bench.process.spawn(niceness=N): the server, and every thread it starts, runs N nicer than
the benchmark (bench.overload --server-nice: the load generator on the same cores is not the
side starved; docs/performance.md, "Which of the two")."""

from __future__ import annotations

import os
from pathlib import Path

from textserve.bench.process import echo_command, spawn


def _nice(pid: int, tid: int) -> int:
    """The scheduling niceness of thread `tid` of process `pid` (/proc stat field 19)."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


def test_spawned_server_and_its_threads_run_nicer_by_niceness() -> None:
    own = os.nice(0)
    with spawn(echo_command(), niceness=5) as server:
        tasks = [int(t) for t in os.listdir(f"/proc/{server.pid}/task")]
        assert len(tasks) > 1  # grpc's threads, started after the main one
        assert {_nice(server.pid, tid) for tid in tasks} == {min(own + 5, 19)}


def test_spawned_server_keeps_the_benchmarks_niceness_by_default() -> None:
    own = os.nice(0)
    with spawn(echo_command()) as server:
        assert _nice(server.pid, server.pid) == own
