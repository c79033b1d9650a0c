"""Inference below the front end: the threads that tokenize and run the graph run at a lower
CPU priority (a higher niceness, `--inference-nice`) than the event loop and grpc's threads.

    lower_priority(10)                          # this thread, and the threads it starts
    session = in_lowered_thread(lambda: Session(path, runtime), 10)   # onnxruntime's pool too

Why (issue 39): where the loop and the model share a core, a call waits in grpc core, and an
HTTP request unread in its socket, for as long as a batch holds that core, and a refusal is
answered only once the loop reads the call. With the model below the loop, the loop takes every
call as it arrives: the ones past the bound on calls in flight (`--max-concurrent-rpcs`, gRPC and
HTTP) are refused within milliseconds, and the model runs whenever the loop has nothing to do. One
worker pinned to one core at 1.5x its peak, docs/performance.md: refusals' p99 17 ms against
190-290 ms, and half again as many calls served. Where the loop has a core of its own the
niceness changes nothing.

On Linux niceness belongs to a thread and a thread starts with its creator's: the batch thread
lowers itself when it starts, onnxruntime's pool threads are started by a session created in a
lowered thread, and an engine process (`--engine process|shared`) lowers all its threads
before it creates a session. Elsewhere (no per-thread niceness) nothing is changed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

MOST = 19  # the highest niceness Linux has


def lower_priority(nice: int, base_pid: int | None = None) -> int | None:
    """Set the calling thread's niceness to `nice` above the niceness of `base_pid`'s main
    thread (default: this process's, the event loop's); at most 19, never lower than it is.
    Returns the niceness set, or None where nothing was changed (`nice` 0, not Linux, refused)."""
    if nice <= 0 or sys.platform != "linux":
        return None
    tid = threading.get_native_id()
    try:
        base = os.getpriority(os.PRIO_PROCESS, os.getpid() if base_pid is None else base_pid)
        target = max(min(MOST, base + nice), os.getpriority(os.PRIO_PROCESS, tid))
        os.setpriority(os.PRIO_PROCESS, tid, target)
    except OSError as exc:  # e.g. the base process is gone, or a policy forbids it
        logger.warning("inference threads keep the front end's CPU priority: %s", exc)
        return None
    return target


def lower_process(nice: int, base_pid: int) -> None:
    """An engine process's: every thread it has (numpy's, started at import) and, through the
    calling thread, every thread it starts, `nice` above `base_pid`'s main thread."""
    target = lower_priority(nice, base_pid)
    if target is None:
        return
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that has just ended
            if os.getpriority(os.PRIO_PROCESS, int(task)) < target:
                os.setpriority(os.PRIO_PROCESS, int(task), target)


def in_lowered_thread(make: Callable[[], T], nice: int) -> T:
    """`make()` run in a new thread lowered by `nice` (see lower_priority), so the threads it
    starts (onnxruntime's intra-op pool, when a session is created) inherit the niceness; its
    result, or its exception raised here. `nice` 0: `make()` in this thread."""
    if nice <= 0 or sys.platform != "linux":
        return make()
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        lower_priority(nice)
        try:
            outcome.append(make())
        except BaseException as exc:  # raised again in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="lowered", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]
