"""service/engine/priority.py: a lowered thread, and the threads it starts, run `nice` above
the process's main thread; 0 changes nothing; the batch threads of a Batcher are lowered."""

from __future__ import annotations

import asyncio
import os
import threading

import numpy as np
import pytest

from textserve.service.config import BatcherConfig
from textserve.service.engine.batcher import Batcher
from textserve.service.engine.priority import MOST, in_lowered_thread, lower_priority

pytestmark = pytest.mark.skipif(not hasattr(os, "getpriority"), reason="per-thread niceness")


def niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def base() -> int:
    return os.getpriority(os.PRIO_PROCESS, os.getpid())


def started_thread_niceness() -> tuple[int, int]:
    """This thread's niceness and that of a thread it starts."""
    seen: list[int] = []
    child = threading.Thread(target=lambda: seen.append(niceness()))
    child.start()
    child.join()
    return niceness(), seen[0]


def test_a_lowered_thread_and_the_threads_it_starts_run_below_the_main_thread() -> None:
    before = niceness()
    own, child = in_lowered_thread(started_thread_niceness, 3)
    assert own == child == min(MOST, base() + 3)
    assert niceness() == before  # the caller's thread is left as it was


def test_zero_changes_nothing_and_runs_in_the_callers_thread() -> None:
    assert in_lowered_thread(threading.get_native_id, 0) == threading.get_native_id()
    assert lower_priority(0) is None


def test_at_most_19_and_never_raised_back() -> None:
    def twice() -> tuple[int | None, int | None, int]:
        first = lower_priority(50)
        return first, lower_priority(1), niceness()  # already lower than base + 1: kept

    first, second, now = in_lowered_thread(twice, 1)
    assert first == second == now == MOST


def test_an_exception_in_the_lowered_thread_is_raised_in_the_callers() -> None:
    def fail() -> None:
        raise ValueError("no session")

    with pytest.raises(ValueError, match="no session"):
        in_lowered_thread(fail, 2)


@pytest.mark.parametrize("nice", [0, 4])
def test_a_batchers_threads_run_batches_nice_below_the_loop(nice: int) -> None:
    seen: list[int] = []

    def run_batch(payloads: list[str]) -> np.ndarray:
        seen.append(niceness())
        return np.zeros((len(payloads), 2), dtype=np.float32)

    async def main() -> None:
        batcher = Batcher(run_batch, BatcherConfig(), nice=nice)
        batcher.start()
        await batcher.submit(["a"], [1])
        await batcher.close()

    asyncio.run(main())
    assert seen == [min(MOST, base() + nice)]
