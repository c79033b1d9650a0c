"""The load generator's connections to a real two-worker `textserve serve` (tests/serving.py
serve_subprocess, a hand-made model): opened blindly, the kernel splits them by a hash of
their ports (measured: 4 connections 3-1 or 4-0 six times in six); spread, each worker holds
its share, which its health Check answer (textserve-worker) confirms."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from tests.handmade import make_version
from tests.serving import serve_subprocess
from textserve.bench.loadgen import _worker_of, spread_channels


async def _splits(address: str, rounds: int) -> list[list[int]]:
    splits = []
    for _ in range(rounds):
        channels = await spread_channels(address, 4, 2)
        try:
            workers = Counter([await _worker_of(c) for c in channels])
        finally:
            await asyncio.gather(*(c.close() for c in channels))
        assert len(workers) == 2 and all(w.count("/") == 1 for w in workers)  # INDEX/PID
        splits.append(sorted(workers.values()))
    return splits


def test_four_connections_are_two_on_each_of_two_workers(tmp_path: Path) -> None:
    root = tmp_path / "models"
    make_version(root, "handmade", 1)
    with serve_subprocess(root, "--workers", "2") as server:
        # five rounds: a blind split would be 2-2 in all five about once in 140 runs
        assert asyncio.run(_splits(server.address, 5)) == [[2, 2]] * 5
