"""The load generator spreads its gRPC connections evenly over a `--workers N` server's
processes (loadgen.spread_channels): the kernel hashes each connection to one of them, so it
asks each new connection which worker holds it and sets aside the ones past a worker's share.
Here the connections are fakes and the workers they land on are scripted; against a real
two-worker server: tests/integration/test_bench_spread.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from textserve.bench import loadgen


class FakeChannel:
    def __init__(self, index: int) -> None:
        self.index = index
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def _landing(monkeypatch: pytest.MonkeyPatch, workers: str) -> list[FakeChannel]:
    """Connection i lands on worker workers[i]; the channels opened, in order."""
    opened: list[FakeChannel] = []

    def channel(target: str, index: int) -> Any:
        opened.append(FakeChannel(index))
        return opened[-1]

    async def worker_of(channel: Any) -> str:
        return workers[channel.index]

    monkeypatch.setattr(loadgen, "_channel", channel)
    monkeypatch.setattr(loadgen, "_worker_of", worker_of)
    return opened


def test_connections_past_a_workers_share_are_set_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    opened = _landing(monkeypatch, "aaabab")
    kept = asyncio.run(loadgen.spread_channels("t", 4, 2))
    assert [c.index for c in kept] == [0, 1, 3, 5]  # a a b b: the third a set aside
    assert [c.index for c in opened if c.closed] == [2, 4]  # the spare ones closed, not kept
    assert not any(c.closed for c in kept)


def test_an_uneven_count_spreads_as_evenly_as_it_divides(monkeypatch: pytest.MonkeyPatch) -> None:
    _landing(monkeypatch, "aaaabbb")
    kept = asyncio.run(loadgen.spread_channels("t", 5, 2))
    assert [c.index for c in kept] == [0, 1, 2, 4, 5]  # 3 on a, 2 on b


def test_a_worker_never_reached_is_an_error_naming_the_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened = _landing(monkeypatch, "a" * 200)
    with pytest.raises(RuntimeError, match=r"could not spread 4 connections over 2 workers"):
        asyncio.run(loadgen.spread_channels("t", 4, 2))
    assert len(opened) == 200 and all(c.closed for c in opened)  # 50 tries a connection
