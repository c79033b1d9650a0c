"""Where the benchmark puts the server beside its load generator.

bench.process.spawn(niceness=N): the server, and every thread it starts, runs N nicer than
the benchmark (bench.overload --server-nice: the load generator on the same cores is not the
side starved; docs/performance.md, "Which of the two"). On Linux getpriority(PRIO_PROCESS, tid)
is that thread's own niceness. spawn(cpus=S): the server and every thread it starts run on S
only (bench.overload --server-cpus / --loadgen-cpus: the load generator on cores of its own,
"The load generator on a core of its own"); sched_getaffinity(tid) is that thread's own set."""

from __future__ import annotations

import argparse
import os

import pytest

from textserve.bench.overload import cpu_list, main, pin
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


def test_spawned_server_and_its_threads_run_on_the_cpus_given() -> None:
    own = os.sched_getaffinity(0)
    one = frozenset({max(own)})
    with spawn(echo_command(), cpus=one) as server:
        tasks = [int(t) for t in os.listdir(f"/proc/{server.pid}/task")]
        assert len(tasks) > 1
        assert {frozenset(os.sched_getaffinity(tid)) for tid in tasks} == {one}
    assert os.sched_getaffinity(0) == own  # the benchmark's own CPUs unchanged


def test_spawned_server_keeps_the_benchmarks_cpus_by_default() -> None:
    with spawn(echo_command()) as server:
        assert os.sched_getaffinity(server.pid) == os.sched_getaffinity(0)


def test_cpu_lists_name_cpus_this_process_may_use() -> None:
    usable = sorted(os.sched_getaffinity(0))
    assert cpu_list(str(usable[0])) == {usable[0]}
    assert cpu_list(f"{usable[0]}-{usable[-1]}") >= {usable[0], usable[-1]}
    for bad in ("x", "1-", "", str(usable[-1] + 1000)):
        with pytest.raises(argparse.ArgumentTypeError):
            cpu_list(bad)


def test_a_bad_cpu_list_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--loadgen-cpus", "0-x"])
    assert exited.value.code == 2
    assert "--loadgen-cpus: '0-x' is not a CPU list like 0 or 0-1" in capsys.readouterr().err


def test_pinning_the_load_generator_alone_leaves_the_server_every_cpu() -> None:
    usable = frozenset(os.sched_getaffinity(0))
    one = frozenset({max(usable)})
    try:
        assert pin(None, None) is None
        assert pin(None, one) == usable  # not the load generator's one CPU, inherited
        assert os.sched_getaffinity(0) == one
        assert pin(frozenset({min(usable)}), one) == {min(usable)}
    finally:
        os.sched_setaffinity(0, usable)
