"""Coalesce per-request work (tokenization) into one executor run at a time, off the event loop.

Imports neither grpc nor onnxruntime. Everything callers submit while one run is going on is
done together in the next run, so under load one thread hop serves many requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    """Run `fn(items) -> results` (one result per item) on an executor, coalescing callers.

    At most one run is in flight; whatever callers submit meanwhile goes into the next run
    together, so under load one thread hop serves many requests (tokenizers' encode_batch is
    parallel inside and releases the GIL).
    """

    def __init__(
        self,
        fn: Callable[[list[T]], Sequence[R]],
        executor: Executor,
        *,
        on_run: Callable[[int, float], None] | None = None,  # (items, seconds) per run
    ) -> None:
        self._fn = fn
        self._executor = executor
        self._on_run = on_run
        self._pending: list[tuple[Sequence[T], asyncio.Future[Sequence[R]]]] = []
        self._task: asyncio.Task[None] | None = None

    async def run(self, items: Sequence[T]) -> Sequence[R]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Sequence[R]] = loop.create_future()
        self._pending.append((items, future))
        if self._task is None:
            self._task = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                jobs, self._pending = self._pending, []
                jobs = [(items, fut) for items, fut in jobs if not fut.done()]
                if not jobs:
                    continue
                flat = [x for items, _ in jobs for x in items]
                started = time.perf_counter()
                try:
                    results = await loop.run_in_executor(self._executor, self._fn, flat)
                except Exception as exc:
                    for _, fut in jobs:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                if self._on_run is not None:
                    self._on_run(len(flat), time.perf_counter() - started)
                offset = 0
                for items, fut in jobs:
                    end = offset + len(items)
                    if not fut.done():
                        fut.set_result(results[offset:end])
                    offset = end
        finally:
            self._task = None
