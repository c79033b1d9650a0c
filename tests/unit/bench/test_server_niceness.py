"""bench.process.spawn(niceness=N): the server, and every thread it starts, runs N nicer than
the benchmark (bench.overload --server-nice: the load generator on the same cores is not the
side starved; docs/performance.md, "Which of the two"). On Linux getpriority(PRIO_PROCESS, tid)
is that thread's own niceness."""

from __future__ import annotations

import os

from textserve.bench.process import echo_command, spawn


def test_spawned_server_and_its_threads_run_nicer_by_niceness() -> None:
    own = os.nice(0)
    with spawn(echo_command(), niceness=5) as server:
        tasks = [int(t) for t in os.listdir(f"/proc/{server.pid}/task")]
        assert len(tasks) > 1  # grpc's threads, started after the main one
        assert {os.getpriority(os.PRIO_PROCESS, tid) for tid in tasks} == {min(own + 5, 19)}


def test_spawned_server_keeps_the_benchmarks_niceness_by_default() -> None:
    own = os.nice(0)
    with spawn(echo_command()) as server:
        assert os.getpriority(os.PRIO_PROCESS, server.pid) == own
