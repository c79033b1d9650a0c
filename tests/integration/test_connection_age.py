"""`--max-connection-age`: grpc asks a connection to close once it is that old (GOAWAY), its
calls in flight finish, and the client reconnects, so the kernel hands the new connection to
any worker of `--workers N` (a restarted one included: in the soak every connection of the
killed worker went to the survivor and stayed there). Real servers (tests/serving.py
serve_subprocess, a hand-made model), real channels; which worker answered is the health
Check's textserve-worker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.handmade import make_version
from tests.serving import serve_subprocess
from textserve import cli
from textserve.cli import CliError, build_parser
from textserve.client import Client
from textserve.service.cli import build_config
from textserve.spread import HEALTH_CHECK, WORKER_KEY

MODEL = "handmade"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("age") / "models"
    make_version(root, MODEL, 1)
    return root


def _workers_seen(address: str, seconds: float) -> set[str]:
    """The workers one channel's Check answers came from over `seconds` (it reconnects by
    itself after a GOAWAY)."""
    seen: set[str] = set()
    with grpc.insecure_channel(address) as channel:
        check = channel.unary_unary(HEALTH_CHECK)
        end = time.monotonic() + seconds
        while time.monotonic() < end and len(seen) < 2:
            _, call = check.with_call(b"", timeout=10, wait_for_ready=True)
            seen.add(dict(call.initial_metadata())[WORKER_KEY])
            time.sleep(0.05)
    return seen


def test_an_old_connection_is_replaced_and_lands_on_the_other_worker_too(
    repository: Path,
) -> None:
    # a connection lives 0.3 s: in 10 s a channel reconnects ~30 times, each to either worker
    # (one worker every time: about once in 500 million)
    with serve_subprocess(repository, "--workers", "2", "--max-connection-age", "0.3") as server:
        assert len(_workers_seen(server.address, 10.0)) == 2
    # without it the channel's one connection stays on one worker
    with serve_subprocess(repository, "--workers", "2") as server:
        assert len(_workers_seen(server.address, 2.0)) == 1


def test_a_call_in_flight_past_the_age_finishes(repository: Path) -> None:
    # a ClassifyStream of 1.5 s on a connection asked to close after 0.3 s runs to its end,
    # every message answered in order (no grace period cuts it)
    def texts() -> Iterator[str]:
        for i in range(30):
            time.sleep(0.05)
            yield f"film {i}"

    with (
        serve_subprocess(repository, "--max-connection-age", "0.3") as server,
        Client(server.address) as client,
    ):
        results = list(client.classify_stream(texts(), max_inflight=4))
    assert len(results) == 30 and all(r.predictions for r in results)


@pytest.mark.parametrize(("value", "age"), [(None, None), ("300", 300.0), ("0", None)])
def test_the_flag_and_its_default(value: str | None, age: float | None) -> None:
    extra = [] if value is None else ["--max-connection-age", value]
    assert build_config(build_parser().parse_args(["serve", *extra])).max_connection_age == age


def test_the_environment_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEXTSERVE_MAX_CONNECTION_AGE", "90")
    assert build_config(build_parser().parse_args(["serve"])).max_connection_age == 90.0


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "3000000"])
def test_a_bad_age_is_one_line_and_status_2(
    repository: Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(CliError, match="--max-connection-age must be 0 \\(off\\) or seconds"):
        build_config(build_parser().parse_args(["serve", "--max-connection-age", value]))
    code = cli.main(["serve", "--repository", str(repository), "--max-connection-age", value])
    assert code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("textserve serve: error: --max-connection-age must be 0 (off)")
