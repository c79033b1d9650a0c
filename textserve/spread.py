"""Spreading a client's connections evenly over the processes of a `--workers N` server.

The N workers share one port (SO_REUSEPORT) and the kernel hands each new connection to one of
them by a hash of its addresses and ports: requests go where their connection went, and
connections opened blindly split unevenly more often than not (measured on a two-worker
server: 4 connections 3-1 or 4-0 six times in six, 32 connections up to 21-11). A worker's
grpc.health.v1 Check answer names it (WORKER_KEY, "INDEX/PID") and how many workers the server
runs (WORKERS_KEY), so a client can ask each new connection where it landed and set aside the
ones past a worker's share (`Client.spread()`, `AsyncClient.spread()`, the load generator's
`spread_channels`), opening others instead:

    serve, close, plan = spread_blocking(channels, open_one, check)  # check: -> metadata
    serve, close, plan = await spread_async(channels, open_one, check)

The kernel's choice is random per connection, so a few spare connections are usually enough;
after MAX_TRIES connections a connection, `exhausted` says to stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)
Metadata = Iterable[tuple[str, str | bytes]]
C = TypeVar("C")  # a channel, blocking or grpc.aio

WORKER_KEY = "textserve-worker"  # "INDEX/PID": the worker that answered, on Check answers
WORKERS_KEY = "textserve-workers"  # how many workers the server runs ("2")
HEALTH_CHECK = "/grpc.health.v1.Health/Check"  # its request: b"" (an empty HealthCheckRequest)
MAX_TRIES = 50  # connections opened for each one kept, at most


def check_blocking(channel: Any, timeout: float | None, metadata: Metadata = ()) -> Metadata:
    """The initial metadata of a health Check answer on a blocking `channel`."""
    _, call = channel.unary_unary(HEALTH_CHECK).with_call(b"", timeout=timeout, metadata=metadata)
    return call.initial_metadata() or ()


async def check_async(channel: Any, timeout: float | None, metadata: Metadata = ()) -> Metadata:
    """check_blocking on a grpc.aio `channel`."""
    call = channel.unary_unary(HEALTH_CHECK)(b"", timeout=timeout, metadata=metadata)
    await call
    return await call.initial_metadata() or ()


class Spread:
    """Which of the connections opened one after another to keep, so that `connections` end up
    as evenly over a server's workers as they divide. A server of one process (no worker in
    its answers) keeps every connection."""

    def __init__(self, connections: int) -> None:
        if connections < 1:
            raise ValueError(f"connections must be at least 1, got {connections}")
        self.connections = connections
        self.held: dict[str, int] = {}  # worker -> connections kept on it
        self.kept = 0
        self.tries = 0
        self.workers = 0  # from the server's answer (0: not known yet, or one process)

    @property
    def done(self) -> bool:
        return self.kept == self.connections

    @property
    def exhausted(self) -> bool:
        """Tried MAX_TRIES connections for each one wanted without spreading them."""
        return not self.done and self.tries >= MAX_TRIES * self.connections

    def offer(self, metadata: Iterable[tuple[str, str | bytes]]) -> bool:
        """Whether to keep a new connection whose Check answer carried `metadata`."""
        self.tries += 1
        answer = {key: value for key, value in metadata if isinstance(value, str)}
        worker = answer.get(WORKER_KEY)
        if worker is None:  # one process: every connection is on it
            self.kept += 1
            return True
        workers = answer.get(WORKERS_KEY, "")
        self.workers = max(self.workers, int(workers) if workers.isdigit() else 0)
        share = -(-self.connections // max(self.workers, 1))  # the most a worker holds
        if self.held.get(worker, 0) >= share:
            return False
        self.held[worker] = self.held.get(worker, 0) + 1
        self.kept += 1
        return True

    def split(self) -> list[int]:
        """The connections kept on each worker, most first ([] for one process)."""
        return sorted(self.held.values(), reverse=True)

    def settle(self, kept: list[C], spare: list[C]) -> tuple[list[C], list[C]]:
        """The channels to serve from (`kept`, topped up from `spare` to the count when the
        spread stopped short: an uneven split, logged) and those to close."""
        if self.exhausted:
            logger.warning(
                "could not spread %d connections evenly over the server's %d workers after %d "
                "tries (held %s): keeping an uneven split",
                self.connections, self.workers, self.tries, self.split(),
            )  # fmt: skip
        short = self.connections - len(kept)
        return [*kept, *spare[:short]], spare[short:]


class _Round(Generic[C]):
    """One spreading of `channels`: the next channel to ask (those given, then new ones), what
    it answered, and the outcome."""

    def __init__(self, channels: list[C], open_one: Callable[[int], C]) -> None:
        self.plan, self.open_one = Spread(len(channels)), open_one
        self.unused, self.opened = list(channels), list[C]()
        self.kept, self.spare = list[C](), list[C]()

    def next(self) -> C | None:
        if self.plan.done or self.plan.exhausted:
            return None
        if self.unused:
            return self.unused.pop(0)
        self.opened.append(self.open_one(self.plan.tries))
        return self.opened[-1]

    def answered(self, channel: C, metadata: Metadata) -> None:
        (self.kept if self.plan.offer(metadata) else self.spare).append(channel)

    def outcome(self) -> tuple[list[C], list[C], Spread]:
        return (*self.plan.settle(self.kept, self.spare), self.plan)


def spread_blocking(
    channels: list[C], open_one: Callable[[int], C], check: Callable[[C], Metadata]
) -> tuple[list[C], list[C], Spread]:
    """`channels` spread over the server's workers: (those to serve from, those to close, the
    plan); `open_one(i)` opens another, `check(channel)` is its Check answer's metadata. An
    error of `check` is raised with the channels opened here closed (`channels` untouched)."""
    turn = _Round(channels, open_one)
    try:
        while (channel := turn.next()) is not None:
            turn.answered(channel, check(channel))
    except BaseException:
        for new in turn.opened:
            new.close()  # type: ignore[attr-defined]
        raise
    return turn.outcome()


async def spread_async(
    channels: list[C], open_one: Callable[[int], C], check: Callable[[C], Awaitable[Metadata]]
) -> tuple[list[C], list[C], Spread]:
    """spread_blocking over grpc.aio channels (`check` awaited)."""
    turn = _Round(channels, open_one)
    try:
        while (channel := turn.next()) is not None:
            turn.answered(channel, await check(channel))
    except BaseException:
        await asyncio.gather(*(new.close() for new in turn.opened))  # type: ignore[attr-defined]
        raise
    return turn.outcome()
