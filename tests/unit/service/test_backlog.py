"""grpc's backlog counted (service/backlog.py): the calls grpc started and neither ended nor
handed to the guard, and how many of the next calls the guard refuses once they waited longer
than the bound. Numbers in, numbers out: a fake reader of grpc's counts and a fake clock."""

from __future__ import annotations

import pytest

from textserve.cli import CliError, build_parser
from textserve.service.backlog import FAILOVER, REFUSAL_MESSAGE, Backlog
from textserve.service.cli import build_config
from textserve.service.config import ConfigError, ServerConfig

STEP = 0.05


class Grpc:
    """grpc core's counts as channelz gives them."""

    def __init__(self) -> None:
        self.started = 0
        self.ended = 0
        self.failed = 0  # of those ended: refused (RESOURCE_EXHAUSTED), cancelled...

    def read(self) -> tuple[int, int, int]:
        return self.started, self.ended, self.ended - self.failed


def _backlog(
    max_wait: float | None = 1.0, target: float | None = None
) -> tuple[Backlog, Grpc, list[float]]:
    grpc, now = Grpc(), [0.0]
    backlog = Backlog(max_wait, grpc.read, target=target, clock=lambda: now[0], interval=STEP)
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


def _take(backlog: Backlog, grpc: Grpc, calls: int) -> tuple[int, int]:
    """The loop takes `calls` calls as the guard does: it refuses those up to shed_until (they
    end at once, failed), the others are served (and end); (served, refused)."""
    refused = 0
    for _ in range(calls):
        backlog.entries += 1
        grpc.ended += 1
        if backlog.entries <= backlog.shed_until:
            backlog.refuse()
            grpc.failed += 1
            refused += 1
    return calls - refused, refused


def _overloaded(backlog: Backlog, grpc: Grpc, now: list[float], seconds: float) -> list[int]:
    """Open loop: 20 calls arrive a sample whatever is answered, the loop takes 10 (it serves
    10 a sample, refusing costs nothing here); what the guard would refuse at each sample."""
    excess = []
    for _ in range(round(seconds / STEP)):
        grpc.started += 20
        _take(backlog, grpc, 10 + max(0, backlog.shed_until - backlog.entries))
        excess.append(_tick(backlog, now))
    return excess


def test_a_standing_backlog_is_shed_down_to_the_target_after_a_second() -> None:
    backlog, grpc, now = _backlog(max_wait=2.0, target=0.1)
    excess = _overloaded(backlog, grpc, now, 4.0)
    # calls are older than 0.1 s from the fifth sample (0.25 s) on and have waited for a second
    # from 1.25 s, but arrivals are judged only against SETTLED (2) seconds served: shed from 2 s
    assert all(e == 0 for e in excess[:39]) and all(e > 0 for e in excess[41:])
    assert "100 ms" in backlog.message
    # the refused calls do not come back (an open loop): still shed two seconds later, the
    # backlog held at 0.1 s of arrivals (40) or so
    waiting = grpc.started - grpc.ended
    assert waiting - excess[-1] <= 2 * 20 + 20
    assert backlog.refused > 0.4 * grpc.started * (2 / 4)
    # without the target, the same overload refuses nothing for 2 s: every call waits 2 s
    plain, grpc2, now2 = _backlog(max_wait=2.0)
    assert not any(_overloaded(plain, grpc2, now2, 1.9))


def _closed_loop(backlog: Backlog, grpc: Grpc, now: list[float], seconds: float) -> list[int]:
    """Callers that send again the moment they are answered: the loop takes 10 calls a sample
    to serve and the refused ones besides (refusing costs it nothing here); every answered call
    comes back at once. The calls refused at each sample."""
    refused = []
    for _ in range(round(seconds / STEP)):
        shed = max(0, backlog.shed_until - backlog.entries)
        _, refusals = _take(backlog, grpc, min(grpc.started - grpc.ended, 10 + shed))
        grpc.started += 10 + refusals  # answered, back at once
        refused.append(refusals)
        _tick(backlog, now)
    return refused


def test_callers_that_come_back_at_once_are_not_shed_to_the_target() -> None:
    """500 callers in a closed loop, the server serving 200 calls/s: a backlog of 2.5 s, so
    the guard refuses the calls past max_wait, and they come straight back: arrivals exceed
    what the server serves, but they are not new load. Shedding to the target must not begin
    (its refusals, back at once, would keep it going for ever: ~95 % of the calls refused)."""
    backlog, grpc, now = _backlog(max_wait=2.0, target=0.1)
    grpc.started = 500
    bounds = []
    refused = []
    for _ in range(160):  # 8 s
        refused += _closed_loop(backlog, grpc, now, STEP)
        bounds.append(backlog.message)
    assert sum(refused[60:]) > 0  # the calls past max_wait are refused...
    assert set(bounds[60:]) == {REFUSAL_MESSAGE.format(ms=2000)}  # ... and no others
    assert sum(refused[60:]) < 0.5 * (grpc.started - 500) * (100 / 160)


def test_a_closed_loop_standing_over_the_target_refuses_nothing() -> None:
    """60 callers in a closed loop keep a backlog of 0.3 s (over the 0.1 s target) at the rate
    the server serves; a stall past max_wait has the guard refuse the calls it held, which come
    straight back: that is all it refuses."""
    backlog, grpc, now = _backlog(max_wait=2.0, target=0.1)
    grpc.started = 60
    assert not any(_closed_loop(backlog, grpc, now, 3.0))
    for _ in range(44):  # a stall of 2.2 s: nothing answered, nothing sent
        _tick(backlog, now, alive=False)
    refused = _closed_loop(backlog, grpc, now, 6.0)
    assert refused[0] == 60 and not any(refused[1:]), refused


def test_a_stall_shorter_than_a_second_refuses_nothing() -> None:
    backlog, grpc, now = _backlog(max_wait=2.0, target=0.1)
    _tick(backlog, now)
    for _ in range(3):  # three stalls of 0.8 s, the loop catching up in between
        for _ in range(16):
            grpc.started += 20
            assert _tick(backlog, now, alive=False) == 0
        grpc.ended = grpc.started
        backlog.entries = grpc.ended
        assert _tick(backlog, now) == 0
    assert backlog.shed_until == 0


def test_a_stall_at_a_rate_the_server_served_is_not_shed_to_the_target() -> None:
    """A backlog standing longer than a second while calls arrive no faster than the server
    served them a moment ago is a stall (a hot reload on shared cores): nothing is refused
    before the age bound. The same stall under arrivals twice as fast is overload: shed."""
    for rate, shed in ((10, False), (20, True)):
        backlog, grpc, now = _backlog(max_wait=2.0, target=0.1)
        for _ in range(60):  # 3 s at 10 calls a sample, each served at once
            grpc.started += 10
            grpc.ended += 10
            backlog.entries += 10
            assert _tick(backlog, now) == 0
        excess = []
        for _ in range(32):  # a stall of 1.6 s: calls arrive, none is taken
            grpc.started += rate
            excess.append(_tick(backlog, now, alive=False))
        assert any(excess) is shed, (rate, excess)
        assert backlog.message == REFUSAL_MESSAGE.format(ms=100 if shed else 2000)


def test_the_target_must_be_shorter_than_the_bound() -> None:
    assert Backlog(1.0, Grpc().read, target=0.1).target == 0.1
    assert Backlog(1.0, Grpc().read, target=1.0).target is None
    assert Backlog(None, Grpc().read, target=0.1).target is None


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


@pytest.mark.parametrize(("flag", "seconds"), [("50", 0.05), ("0", None)])
def test_the_target_flag(flag: str, seconds: float | None) -> None:
    args = build_parser().parse_args(["serve", "--backlog-target-ms", flag])
    assert build_config(args).backlog_target == seconds


def test_the_default_and_the_bounds() -> None:
    config = build_config(build_parser().parse_args(["serve"]))
    assert (config.max_backlog_wait, config.backlog_target) == (2.0, 0.1)
    with pytest.raises(ConfigError):
        ServerConfig(max_backlog_wait=31.0)
    with pytest.raises(ConfigError, match="--backlog-target-ms"):
        ServerConfig(backlog_target=-0.001)


@pytest.mark.parametrize(("flag", "limit"), [(None, 1024), ("64", 64), ("0", None)])
def test_the_streams_flag(flag: str | None, limit: int | None) -> None:
    extra = [] if flag is None else ["--max-streams-per-connection", flag]
    args = build_parser().parse_args(["serve", *extra])
    assert build_config(args).max_streams_per_connection == limit


def test_the_streams_flag_refuses_a_negative_count() -> None:
    args = build_parser().parse_args(["serve", "--max-streams-per-connection", "-1"])
    with pytest.raises(CliError, match="--max-streams-per-connection must be 1 to"):
        build_config(args)


def _failover(peer_lost: bool) -> list[str]:
    """A worker of two serving its share, 10 calls a sample, each at once, for 3 s; then the
    other dies: its clients reconnect here and 20 arrive a sample while the replacement
    warming up beside it stalls this one. The bound of each sample's refusals ("" for none)."""
    backlog, grpc, now = _backlog(max_wait=2.0, target=0.1)
    for _ in range(60):
        grpc.started += 10
        grpc.ended += 10
        backlog.entries += 10
        assert _tick(backlog, now) == 0
    if peer_lost:
        backlog.peer_lost()
    bounds = []
    for _ in range(round(FAILOVER / STEP) + 20):
        grpc.started += 20
        bounds.append(backlog.message if _tick(backlog, now, alive=False) > 0 else "")
    return bounds


def test_a_dead_peers_load_is_not_overload_for_a_moment() -> None:
    """For FAILOVER seconds after the supervisor's PeerLost, a standing backlog under doubled
    arrivals is not shed to the target (only calls past the age bound are refused); after
    them it is. Without PeerLost the same is overload within about a second."""
    target, age = REFUSAL_MESSAGE.format(ms=100), REFUSAL_MESSAGE.format(ms=2000)
    calm = round(FAILOVER / STEP)
    told = _failover(peer_lost=True)
    assert set(told[:calm]) == {"", age}  # the age bound only, from 2 s on
    assert target in told[calm:]  # still standing once FAILOVER is over: shed
    untold = _failover(peer_lost=False)
    assert target in untold[: round(1.5 / STEP)]


class Counted:
    """A prometheus Counter's inc(), kept."""

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


def test_calls_grpc_ended_that_no_handler_ran_are_counted_once() -> None:
    grpc, now, counted = Grpc(), [0.0], Counted()
    backlog = Backlog(1.0, grpc.read, unhandled=counted, clock=lambda: now[0], interval=STEP)
    grpc.started, backlog.entries, backlog.in_app = 10, 10, 10  # ten calls in handlers
    _tick(backlog, now)
    grpc.started += 5
    grpc.ended += 5  # five refused by grpc.aio's limiter: ended, never entered a handler
    grpc.failed += 5
    _tick(backlog, now)
    assert counted.value == 5
    backlog.in_app -= 10  # the ten leave their handlers, then grpc ends them
    assert _tick(backlog, now) <= 0
    assert counted.value == 5  # between the two: never counted
    grpc.ended += 10
    for _ in range(3):
        _tick(backlog, now)
    assert counted.value == 5  # served calls are not unhandled ones; nothing counted twice
