"""The load generator refuses to measure on an uneven split (loadgen.spread_channels): when a
`--workers` server's connections cannot be spread it is an error, not a row. The channels are
fakes, the workers they land on scripted; the policy itself: tests/unit/textserve/
test_spread.py; against a real two-worker server: tests/integration/test_spread_workers.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from textserve.bench import loadgen
from textserve.spread import MAX_TRIES, WORKER_KEY, WORKERS_KEY


class FakeChannel:
    closed = False

    async def close(self) -> None:
        self.closed = True


def test_connections_that_cannot_be_spread_are_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[FakeChannel] = []

    def channel(target: str, index: int) -> Any:
        opened.append(FakeChannel())
        return opened[-1]

    async def check(channel: Any) -> list[tuple[str, str]]:
        return [(WORKER_KEY, "1/100"), (WORKERS_KEY, "2")]  # every connection on worker 1

    monkeypatch.setattr(loadgen, "_channel", channel)
    monkeypatch.setattr(loadgen, "_check", check)
    with pytest.raises(RuntimeError, match=r"could not spread 4 connections over the server's 2"):
        asyncio.run(loadgen.spread_channels("t", 4))
    assert len(opened) == MAX_TRIES * 4 and all(c.closed for c in opened)
