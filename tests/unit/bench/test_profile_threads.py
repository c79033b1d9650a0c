"""`python -m textserve.bench.profile --threads`: the server's CPU by thread role, from
/proc/PID/task snapshots (procfs.thread_cpu_seconds) and Python's thread names."""

from __future__ import annotations

import os
import threading

import pytest

from textserve import procfs
from textserve.bench.profile import per_thread, thread_role


def test_thread_roles_by_name() -> None:
    assert thread_role("MainThread") == "event loop"
    assert thread_role("infer-default:3_0") == "inference"
    assert thread_role("Thread-1 (_poll_wrapper)") == "grpc poller"
    assert thread_role("event_engine") == "grpc event engine"
    assert thread_role("grpc-backlog") == "backlog sampler"
    assert thread_role("asyncio_1") == "executor"
    assert thread_role("worker-12") == "worker"


def test_cpu_per_request_by_role_between_two_snapshots() -> None:
    before = {1: ("python", 1.0), 2: ("python", 0.5), 3: ("event_engine", 0.0)}
    after = {1: ("python", 1.4), 2: ("python", 0.7), 3: ("event_engine", 0.1), 4: ("python", 0.05)}
    names = {1: "MainThread", 2: "infer-m:1_0", 4: "asyncio_0"}
    roles = per_thread(before, after, names, requests=1000)
    # 0.4 s over 1000 requests = 0.4 ms each; a thread born in the window counts from zero
    assert roles == pytest.approx(
        {"event loop": 0.4, "inference": 0.2, "grpc event engine": 0.1, "executor": 0.05}
    )
    assert list(roles) == sorted(roles, key=lambda role: -roles[role])  # costliest first


def test_this_processs_threads_are_read() -> None:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="held")
    worker.start()
    try:
        threads = procfs.thread_cpu_seconds(os.getpid())
    finally:
        stop.set()
        worker.join()
    assert os.getpid() in threads and worker.native_id in threads
    assert all(cpu >= 0 for _, cpu in threads.values())
    assert procfs.thread_cpu_seconds(2**31 - 1) == {}  # no such process
