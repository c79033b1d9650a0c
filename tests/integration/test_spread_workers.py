"""Connections spread evenly over a real two-worker `textserve serve` (tests/serving.py
serve_subprocess, a hand-made model): opened blindly the kernel splits them by a hash of their
ports (measured: 4 connections 3-1 or 4-0 six times in six); spread (textserve.spread), each
worker holds its share, which every connection's own health Check answer confirms. The load
generator (loadgen.spread_channels), Client.spread() and AsyncClient.spread()."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.handmade import make_version
from tests.serving import serve_subprocess
from textserve.bench.loadgen import _check, spread_channels
from textserve.bench.process import ServerProcess
from textserve.cli import main as cli_main
from textserve.client import AsyncClient, Client, ClientError
from textserve.spread import WORKER_KEY, WORKERS_KEY, check_async, check_blocking

MODEL = "handmade"
ROUNDS = 5  # a blind split of 4 connections is 2-2 five times in a row about once in 140


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("spread") / "models"
    make_version(root, MODEL, 1)
    return root


@pytest.fixture(scope="module")
def two_workers(repository: Path) -> Iterator[ServerProcess]:
    with serve_subprocess(repository, "--workers", "2") as server:
        yield server


def _landed(channels: list[grpc.Channel]) -> list[int]:
    """Connections on each worker, most first, as each channel's own Check answer says."""
    workers = Counter()
    for channel in channels:
        metadata = dict(check_blocking(channel, timeout=10))
        assert metadata[WORKERS_KEY] == "2"
        workers[metadata[WORKER_KEY]] += 1
    return sorted(workers.values(), reverse=True)


def test_the_load_generator_holds_two_connections_on_each_worker(
    two_workers: ServerProcess,
) -> None:
    async def splits() -> list[list[int]]:
        out = []
        for _ in range(ROUNDS):
            channels = await spread_channels(two_workers.address, 4)
            try:
                landed = Counter([dict(await _check(c))[WORKER_KEY] for c in channels])
            finally:
                await asyncio.gather(*(c.close() for c in channels))
            out.append(sorted(landed.values()))
        return out

    assert asyncio.run(splits()) == [[2, 2]] * ROUNDS


def test_the_client_spreads_its_connections_and_serves_over_them(
    two_workers: ServerProcess,
) -> None:
    for _ in range(ROUNDS):
        with Client(two_workers.address, connections=4) as client:
            assert client.spread() == [2, 2]
            assert _landed(client._channels) == [2, 2]
            assert all(client.classify(["good film"]).predictions for _ in range(8))


def test_the_async_client_spreads_its_connections(two_workers: ServerProcess) -> None:
    async def spread() -> tuple[list[int], list[int]]:
        async with AsyncClient(two_workers.address, connections=4) as client:
            split = await client.spread()
            landed = Counter()
            for channel in client._channels:
                landed[dict(await check_async(channel, timeout=10))[WORKER_KEY]] += 1
            assert (await client.classify(["good film"])).predictions
            return split, sorted(landed.values())

    for _ in range(ROUNDS):
        assert asyncio.run(spread()) == ([2, 2], [2, 2])


def test_one_process_keeps_every_connection_and_no_server_is_a_client_error(
    repository: Path,
) -> None:
    with serve_subprocess(repository) as server:
        address = server.address
        with Client(address, connections=3) as client:
            assert client.spread() == [] and len(client._channels) == 3
            assert client.classify(["good film"]).predictions
    with Client(address, connections=2, timeout=2) as client:  # the server has stopped
        with pytest.raises(ClientError) as failed:
            client.spread()
        assert failed.value.code == "UNAVAILABLE" and len(client._channels) == 2


def test_classify_of_a_file_spreads_its_connections(
    two_workers: ServerProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    splits: list[list[int]] = []
    spread = Client.spread

    def recorded(client: Client) -> list[int]:
        splits.append(spread(client))
        return splits[-1]

    monkeypatch.setattr(Client, "spread", recorded)
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(f"film number {i}\n" for i in range(12)), encoding="utf-8")
    command = ["classify", "--server", two_workers.address, "--file", str(texts)]
    assert cli_main([*command, "--batch-size", "3", "--json"]) == 0
    assert splits == [[2, 2]]  # its 4 connections (the default), two on each worker
    assert capsys.readouterr().out.count('"label"') == 12
