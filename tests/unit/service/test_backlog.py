"""grpc's backlog counted (service/backlog.py): the calls grpc started and neither ended nor
handed to the guard, and how many of the next calls the guard refuses once they waited longer
than the bound. Numbers in, numbers out: a fake reader of grpc's counts and a fake clock."""

from __future__ import annotations

import pytest

from textserve.cli import build_parser
from textserve.service.backlog import Backlog
from textserve.service.cli import build_config
from textserve.service.config import ConfigError, ServerConfig

STEP = 0.05


class Grpc:
    """grpc core's counts as channelz gives them."""

    def __init__(self) -> None:
        self.started = 0
        self.ended = 0

    def read(self) -> tuple[int, int]:
        return self.started, self.ended


def _backlog(max_wait: float | None = 1.0) -> tuple[Backlog, Grpc, list[float]]:
    grpc, now = Grpc(), [0.0]
    backlog = Backlog(max_wait, grpc.read, clock=lambda: now[0], interval=STEP)
    return backlog, grpc, now


def _tick(backlog: Backlog, now: list[float], *, alive: bool = True) -> int:
    now[0] += STEP
    if alive:
        backlog.beat = now[0]
    return backlog.sample()


def test_calls_held_longer_than_the_bound_are_refused_as_they_are_taken() -> None:
    backlog, grpc, now = _backlog(max_wait=1.0)
    _tick(backlog, now)
    grpc.started = 300  # arrive while the loop is stuck (its beat stops)
    for _ in range(10):
        assert _tick(backlog, now, alive=False) == 0  # 0.5 s: not too old yet
    grpc.started = 500
    excess = 0
    for _ in range(12):
        excess = _tick(backlog, now, alive=False)
    assert excess == 300  # the 300 that came first waited over 1 s; the later 200 did not
    assert backlog.shed_until == backlog.entries + 300
    # the loop takes them: the guard refuses the first 300 it takes, serves the rest
    backlog.entries += 300
    grpc.ended += 300
    assert backlog.entries <= backlog.shed_until
    assert _tick(backlog, now) <= 0
    backlog.entries += 1
    assert backlog.entries > backlog.shed_until


def test_calls_running_in_the_server_are_not_waiting() -> None:
    backlog, grpc, now = _backlog(max_wait=0.1)
    grpc.started = 40
    backlog.in_app = 40  # a long stream each, taken long ago
    for _ in range(10):
        assert _tick(backlog, now) == 0
    assert backlog.shed_until == 0


def test_calls_grpc_dropped_itself_are_not_waiting_forever() -> None:
    """Started and never ended (a caller gone before its call was taken): once the loop runs
    and takes nothing for two samples, they are left out; nothing is refused for them."""
    backlog, grpc, now = _backlog(max_wait=0.2)
    grpc.started = 5  # dead in grpc
    refused = [_tick(backlog, now) for _ in range(10)]
    assert refused[-1] == 0
    grpc.started += 50
    grpc.ended += 50  # served at once, later
    assert all(_tick(backlog, now) == 0 for _ in range(10))


def test_off_refuses_nothing_and_needs_no_reader() -> None:
    backlog, grpc, now = _backlog(max_wait=None)
    grpc.started = 10_000
    for _ in range(40):
        assert _tick(backlog, now, alive=False) == 0
    assert not backlog.on and not Backlog(1.0, None).on  # no channelz: off


@pytest.mark.parametrize(("flag", "seconds"), [("1", 0.001), ("250", 0.25), ("0", None)])
def test_the_flag(flag: str, seconds: float | None) -> None:
    args = build_parser().parse_args(["serve", "--max-backlog-wait-ms", flag])
    assert build_config(args).max_backlog_wait == seconds


def test_the_default_and_the_bounds() -> None:
    assert build_config(build_parser().parse_args(["serve"])).max_backlog_wait == 2.0
    with pytest.raises(ConfigError):
        ServerConfig(max_backlog_wait=31.0)
