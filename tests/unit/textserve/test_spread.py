"""textserve.spread: which of the connections opened one after another a client keeps, so that
they end up evenly on a `--workers N` server's processes. The channels are fakes and the
workers they land on scripted; against a real two-worker server (Client.spread,
AsyncClient.spread, the load generator): tests/integration/test_spread_workers.py."""

from __future__ import annotations

import asyncio
import logging

import pytest

from textserve.spread import (
    MAX_TRIES,
    WORKER_KEY,
    WORKERS_KEY,
    Spread,
    spread_async,
    spread_blocking,
)


class FakeChannel:
    def __init__(self, index: int) -> None:
        self.index = index
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Landing:
    """Connection i lands on worker `script[i]` of `workers` ("-": a server of one process)."""

    def __init__(self, script: str, workers: int = 2) -> None:
        self.script, self.workers = script, workers
        self.opened: list[FakeChannel] = []

    def first(self, n: int) -> list[FakeChannel]:
        self.opened = [FakeChannel(i) for i in range(n)]
        return list(self.opened)

    def open_one(self, index: int) -> FakeChannel:
        self.opened.append(FakeChannel(len(self.opened)))
        return self.opened[-1]

    def check(self, channel: FakeChannel) -> list[tuple[str, str]]:
        worker = self.script[channel.index]
        if worker == "-":
            return []
        return [(WORKER_KEY, f"{worker}/100"), (WORKERS_KEY, str(self.workers))]


def _indices(channels: list[FakeChannel]) -> list[int]:
    return [c.index for c in channels]


def test_connections_past_a_workers_share_are_set_aside() -> None:
    land = Landing("aaabab")
    serve, close, plan = spread_blocking(land.first(4), land.open_one, land.check)
    assert _indices(serve) == [0, 1, 3, 5]  # a a b b
    assert _indices(close) == [2, 4]  # the third and fourth a, to be closed by the caller
    assert plan.split() == [2, 2] and plan.tries == 6


def test_an_uneven_count_spreads_as_evenly_as_it_divides() -> None:
    land = Landing("abcaaab", workers=3)
    serve, _, plan = spread_blocking(land.first(4), land.open_one, land.check)
    assert _indices(serve) == [0, 1, 2, 3] and plan.split() == [2, 1, 1]
    land = Landing("aaaabbb")
    serve, _, plan = spread_blocking(land.first(5), land.open_one, land.check)
    assert _indices(serve) == [0, 1, 2, 4, 5] and plan.split() == [3, 2]


def test_a_server_of_one_process_keeps_every_connection() -> None:
    land = Landing("----")
    serve, close, plan = spread_blocking(land.first(4), land.open_one, land.check)
    assert _indices(serve) == [0, 1, 2, 3] and close == [] and plan.split() == []


def test_a_worker_never_reached_keeps_an_uneven_split_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    land = Landing("a" * (MAX_TRIES * 4))
    with caplog.at_level(logging.WARNING, logger="textserve.spread"):
        serve, close, plan = spread_blocking(land.first(4), land.open_one, land.check)
    assert plan.exhausted and plan.tries == MAX_TRIES * 4
    assert _indices(serve) == [0, 1, 2, 3]  # topped up from the spare ones: still 4
    assert len(close) == MAX_TRIES * 4 - 4
    assert "could not spread 4 connections evenly over the server's 2 workers" in caplog.text


def test_an_error_closes_what_it_opened_and_leaves_the_channels_as_they_were() -> None:
    land = Landing("aaa")  # the fourth connection (a new one) fails its check
    first = land.first(2)
    with pytest.raises(IndexError):
        spread_blocking(first, land.open_one, land.check)
    assert not any(c.closed for c in first)
    assert [c.closed for c in land.opened[2:]] == [True, True]


def test_the_awaited_spread_keeps_the_same_connections() -> None:
    land = Landing("aaabab")

    async def check(channel: FakeChannel) -> list[tuple[str, str]]:
        return land.check(channel)

    serve, close, _ = asyncio.run(spread_async(land.first(4), land.open_one, check))
    assert _indices(serve) == [0, 1, 3, 5] and _indices(close) == [2, 4]


def test_a_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Spread(0)
