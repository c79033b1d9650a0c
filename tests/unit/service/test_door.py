"""The door (service/door.py): the requests let in at once, bounded by count, and by time
under overload: judged with numbers on a clock of the test's own."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from textserve.service.door import FAILOVER, FLOOR, TICK, Door


@dataclass
class Load:
    """Drives a Door tick by tick: rates per second, requests in flight as a level."""

    door: Door
    now: float = 0.0
    extra: list[int] = field(default_factory=lambda: [0])

    def run(
        self,
        seconds: float,
        *,
        arrivals: int,
        answered: int,
        inflight: int,
        refused: int = 0,
        extra: int = 0,
    ) -> None:
        door = self.door
        for _ in range(round(seconds / TICK)):
            self.now += TICK
            door.arrived += round(arrivals * TICK)
            door.done += round(answered * TICK)
            door.refused += round(refused * TICK)
            self.extra[0] += round(extra * TICK)
            door.inflight = inflight
            door.tick(self.now)


def load(ceiling: int | None = 512, wait: float | None = 0.3) -> Load:
    extra = [0]
    door = Door(ceiling, wait, extra_arrivals=lambda: extra[0], clock=lambda: 0.0)
    return Load(door, extra=extra)


def test_the_count_alone_lets_in_up_to_the_ceiling() -> None:
    door = Door(2, None)
    assert door.enter() and door.enter()
    assert not door.enter()  # the third waits for none: refused at once
    assert door.refused == 1 and door.arrived == 3
    assert "--max-concurrent-rpcs" in door.message and door.reason == "concurrent_requests"
    door.leave()
    assert door.enter()  # a slot freed


def test_overload_narrows_the_door_to_what_is_answered_in_the_wait() -> None:
    sim = load()
    sim.run(5, arrivals=1000, answered=1000, inflight=100)  # the peak: 1,000/s
    assert sim.door.limit == 512
    # 1.5x the peak; refusing costs CPU: 800/s answered; the count keeps 512 in flight
    sim.run(0.75, arrivals=1500, answered=800, inflight=512)
    assert sim.door.limit == 512  # not standing for a second yet: a burst passes
    sim.run(1.5, arrivals=1500, answered=800, inflight=512)
    assert sim.door.shedding
    assert sim.door.limit == 240  # 800/s x 0.3 s
    assert "--inflight-wait-ms" in sim.door.message and "240" in sim.door.message
    assert sim.door.reason == "inflight_wait"
    # it stays narrow while the overload lasts (in flight at the bound, arrivals above)
    sim.run(5, arrivals=1500, answered=800, inflight=240, refused=700)
    assert sim.door.limit == 240
    # the overload ends: arrivals fall below what was answered; the count alone again
    sim.run(1.25, arrivals=700, answered=700, inflight=50)
    assert not sim.door.shedding and sim.door.limit == 512


def test_callers_that_resend_at_once_do_not_keep_the_door_narrow() -> None:
    """A closed loop started while the door is narrow: its refused callers come back at once,
    far faster than anything is answered, and their arrivals would keep it narrow for ever
    while the refusals take the CPU: the door opens."""
    sim = load()
    sim.run(5, arrivals=1000, answered=1000, inflight=100)
    sim.run(3, arrivals=1500, answered=800, inflight=512, refused=700)
    assert sim.door.shedding and sim.door.limit == 240
    # refused 3.6x what is answered: the most an open loop at 1.5x the peak was (two workers
    # on 2 shared vCPUs): still overload
    sim.run(0.5, arrivals=3680, answered=800, inflight=240, refused=2880)
    assert sim.door.shedding
    # 6.8x: the HTTP closed loop of 256 callers measured after a gRPC overload (4,900
    # refusals a second against 718 answered): the door opens
    sim.run(1, arrivals=5618, answered=718, inflight=240, refused=4900)
    assert not sim.door.shedding and sim.door.limit == 512


def test_a_stall_is_not_overload() -> None:
    """A hot reload or a collection slows what is answered while arrivals go on at the rate
    the server answered: the waiting requests are the stall's, the loop catches up."""
    sim = load()
    sim.run(5, arrivals=1000, answered=1000, inflight=100)
    sim.run(3, arrivals=1000, answered=100, inflight=512)
    assert not sim.door.shedding and sim.door.limit == 512


def test_a_closed_loop_within_the_count_is_not_overload() -> None:
    """Callers that send again the moment they are answered: their arrivals are what is
    answered, however many of them are in flight."""
    sim = load(ceiling=256)
    sim.run(5, arrivals=1000, answered=1000, inflight=256)
    sim.run(5, arrivals=1000, answered=1000, inflight=256)
    assert not sim.door.shedding and sim.door.limit == 256


def test_a_burst_within_the_wait_is_let_in() -> None:
    """Arrivals above anything answered, but no more in flight than the wait's worth."""
    sim = load()
    sim.run(5, arrivals=500, answered=500, inflight=50)
    sim.run(3, arrivals=1000, answered=1000, inflight=250)  # 1,000/s x 0.3 = 300 > 250
    assert not sim.door.shedding and sim.door.limit == 512


@pytest.mark.parametrize(
    ("arrivals", "refused", "extra"),
    [
        (1500, 700, 0),  # HTTP: the door itself refuses past the count
        (800, 0, 700),  # gRPC: grpc.aio refuses past it before any handler (extra_arrivals)
    ],
)
def test_requests_refused_at_the_count_are_arrivals(
    arrivals: int, refused: int, extra: int
) -> None:
    """An open loop's refused requests do not come back: they are the overload, and the door
    narrows (over gRPC it sees them only in `extra_arrivals`, the backlog's count of calls
    no handler ran)."""
    sim = load()
    sim.run(5, arrivals=1000, answered=1000, inflight=100)
    sim.run(3, arrivals=arrivals, answered=800, inflight=512, refused=refused, extra=extra)
    assert sim.door.shedding and sim.door.limit == 240


def test_the_bound_never_goes_below_the_floor_nor_above_the_ceiling() -> None:
    sim = load()
    sim.run(5, arrivals=40, answered=40, inflight=10)
    sim.run(3, arrivals=400, answered=40, inflight=300)  # 40/s x 0.3 = 12
    assert sim.door.shedding and sim.door.limit == FLOOR
    sim = load(ceiling=100, wait=10.0)
    sim.run(5, arrivals=40, answered=40, inflight=10)
    sim.run(3, arrivals=400, answered=40, inflight=500)  # 40/s x 10 s = 400
    assert sim.door.limit == 100


def test_a_lost_peers_load_is_not_overload_for_a_while() -> None:
    sim = load()
    sim.run(5, arrivals=500, answered=500, inflight=50)
    sim.door._clock = lambda: sim.now
    sim.door.peer_lost()
    sim.run(FAILOVER - 1, arrivals=1500, answered=800, inflight=512)
    assert not sim.door.shedding
    sim.run(2, arrivals=1500, answered=800, inflight=512)
    assert sim.door.shedding and sim.door.limit == 240


def test_off_keeps_the_count() -> None:
    sim = load(wait=None)
    sim.run(5, arrivals=1000, answered=1000, inflight=100)
    sim.run(3, arrivals=1500, answered=800, inflight=512)
    assert not sim.door.shedding and sim.door.limit == 512
