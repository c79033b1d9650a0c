"""The door: how many inference requests one process lets in at once, bounded in time under
overload, not only in count.

`--max-concurrent-rpcs` is a count (grpc.aio's limiter over gRPC, the HTTP app's over HTTP),
and what a count means in time depends on the machine and the moment: 512 requests in flight
are a few milliseconds of work on a GPU and half a second on two busy cores. A count high
enough for every caller of a closed loop at the peak lets a caller under overload wait
count / goodput (Little's law), and goodput under overload is less than the peak (refusing
costs CPU too): at 1.5x the peak on 2 shared vCPUs, 512 in flight over ~1,040 answered/s, an
accepted call's p50 0.5 s and p99 3.25x the closed-loop p99 (bench/results/overload/
nice-f17fb70). The same law bounds the wait in time: `answered/s x W` requests in flight wait
about W.

The door counts the inference requests it lets in (gRPC calls the guard runs, HTTP inference
requests), those that finish, and the arrivals (its own, plus the calls grpc.aio's limiter
refused before any handler: `extra_arrivals`), and judges every TICK:

- overload: arrivals in the last second above OVERLOAD x the most the process answered in any
  second of the last minute (the backlog's test, service/backlog.py: a stall - a hot reload, a
  collection, a busy neighbour - slows what is answered while arrivals go on at the rate it
  was answering; overload brings more than it has ever answered), at every tick for STANDING
  seconds, and more requests in flight than W's worth at the last second's rate;
- then the bound is W's worth (answered in the last second x W, at least FLOOR, at most the
  count): a request past it is refused at once, RESOURCE_EXHAUSTED over gRPC, 429 with
  Retry-After over HTTP, counted in textserve_request_limit_refusals_total{limit=
  "inflight_wait"}; the bound is the textserve_inflight_limit gauge;
- when the arrivals fall back, when the refused come back SPIN times faster than requests
  are answered (callers that resend at once, without a pause: narrowing for them only spends
  the CPU on refusals), or another worker died (`peer_lost`, FAILOVER seconds), the count
  alone again.

A closed loop (callers that send again the moment they are answered) within the count is
never overload: its arrivals are what is answered. Requests refused at the count are arrivals
like any other: an open loop's refused callers do not come back, and their arrivals are the
overload (grpc.aio's limiter refuses them over gRPC, the door itself over HTTP). A closed loop
of more callers than the count, whose refused callers come straight back without a pause, is
judged overload too, and kept to what is answered in W: the callers past it are refused as
they were, the accepted ones wait W.

    door = Door(ceiling=512, wait=0.2)
    door.start(loop)                    # the tick
    if not door.enter(): refuse(door.message)   # per request; door.leave() once answered
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

TICK = 0.25  # seconds between two judgements
OVERLOAD = 1.1  # arrivals over the best second answered: overload (backlog.OVERLOAD)
SETTLED = 2  # seconds of answered counts before arrivals are judged against them
FAILOVER = 5.0  # seconds after another worker died when its load here is not overload
# Seconds arrivals must stay overload, at every tick, before the door narrows: a burst (a
# closed loop starting at once, before the process has answered its first full second) passes.
STANDING = 1.0
# Requests the bound never goes below: enough for full batches (what is answered per second
# falls with the batch, and the bound with it).
FLOOR = 32
# the label `limit` of the refusals (metric_labels.LIMITS): under overload, and at the count
LIMIT, COUNT_LIMIT = "inflight_wait", "concurrent_requests"
# refusals over answered requests in a second past which callers resend at once: an open loop
# at 1.5x the peak is refused 1.2-3.6x what is answered (bench/results/overload, 2 vCPUs, one
# worker and two), an HTTP closed loop of 256 callers begun while the door was narrow 6.8x
# (bench/results/overload/unread-5e10983-pinned: its "peak" 718/s, half the server's)
SPIN = 5
MESSAGE = (
    "the server is overloaded: {n} requests in flight already take {ms:.0f} ms to answer "
    "(--inflight-wait-ms); retry later, with backoff"
)
COUNT_MESSAGE = (
    "the server is answering {n} requests already (--max-concurrent-rpcs); retry after a short wait"
)


class Door:
    """The requests in flight of one process and their bound. `enter`/`leave`/
    `count_refusal` run on the event loop, and so does `tick` (call_later): no lock."""

    def __init__(
        self,
        ceiling: int | None,
        wait: float | None,
        *,
        floor: int = FLOOR,
        gauge: Any = None,
        refusals: Any = None,
        extra_arrivals: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ceiling = ceiling  # the count (None: none); grpc.aio refuses past it over gRPC
        self.wait = wait  # W, seconds (None: the count alone)
        self.floor = floor
        self.limit = ceiling  # the bound now (None: none)
        self.inflight = 0
        self.arrived = 0  # requests at the door, ever (refused ones too)
        self.done = 0  # requests let in and finished, ever
        self.refused = 0  # requests refused for overload, ever
        self.shedding = False
        self._gauge = gauge
        self._refusals = refusals  # textserve_request_limit_refusals_total (method, limit)
        self._extra = extra_arrivals
        self._clock = clock
        # (when, arrivals, done, refused) at each tick of the last second and a bit
        self._ticks: collections.deque[tuple[float, int, int, int]] = collections.deque()
        self._answered: collections.deque[float] = collections.deque(maxlen=60)  # per second
        self._second: tuple[float, int] | None = None  # (when, done) the current second began
        self._calm_until = 0.0
        self._overload_since: float | None = None  # since when arrivals are overload
        self._handle: asyncio.TimerHandle | None = None
        self._set_gauge()

    def enter(self) -> bool:
        """Let one request in (True: call leave() once it is answered), or not (False: the
        caller answers it with `message`; counted here)."""
        self.arrived += 1
        limit = self.limit
        if limit is not None and self.inflight >= limit:
            self.refused += 1
            return False
        self.inflight += 1
        return True

    def leave(self) -> None:
        self.inflight -= 1
        self.done += 1

    @property
    def message(self) -> str:
        """What a refused request is told."""
        if self.shedding:
            return MESSAGE.format(n=self.limit, ms=(self.wait or 0) * 1e3)
        return COUNT_MESSAGE.format(n=self.limit)

    @property
    def reason(self) -> str:
        """The refusals' label `limit`: inflight_wait (overload), concurrent_requests."""
        return LIMIT if self.shedding else COUNT_LIMIT

    def count_refusal(self, method: str | None) -> None:
        """One refusal of `method` in textserve_request_limit_refusals_total."""
        if self._refusals is not None and method is not None:
            self._refusals.labels(method, self.reason).inc()

    def at(self, method: str) -> MethodDoor:
        """The door as one method's guard sees it (its refusals counted under its name)."""
        return MethodDoor(self, method)

    def peer_lost(self) -> None:
        """Another worker died: its clients, reconnecting here, are not overload for a while."""
        self._calm_until = self._clock() + FAILOVER

    def tick(self, now: float | None = None) -> None:
        """Judge the last second and set the bound."""
        now = self._clock() if now is None else now
        arrived = self.arrived + (self._extra() if self._extra is not None else 0)
        ticks = self._ticks
        ticks.append((now, arrived, self.done, self.refused))
        while len(ticks) > 2 and ticks[1][0] <= now - 1.0:
            ticks.popleft()
        if self._second is None:
            self._second = (now, self.done)
        elif now - self._second[0] >= 1.0:
            self._answered.append((self.done - self._second[1]) / (now - self._second[0]))
            self._second = (now, self.done)
        self.limit = self._bound(now)
        self._set_gauge()

    def _bound(self, now: float) -> int | None:
        first = self._ticks[0]
        seconds = now - first[0]
        if (
            self.wait is None
            or seconds < 0.5
            or len(self._answered) < SETTLED
            or now < self._calm_until
        ):
            self.shedding = False
            return self.ceiling
        arrivals = self._ticks[-1][1] - first[1]  # the refused ones too (see above)
        answered = self.done - first[2]
        worth = max(self.floor, int(answered / seconds * self.wait))  # at the rate now
        if arrivals / seconds <= OVERLOAD * max(self._answered):  # not overload: a fresh start
            self._overload_since = None
        elif self._overload_since is None:
            self._overload_since = now
        standing = self._overload_since is not None and now - self._overload_since >= STANDING
        # refused callers coming back SPIN times faster than requests are answered resend
        # without a pause (a closed loop): their arrivals are not overload the door can shed,
        # and narrowing for them only spends the CPU on refusals
        refused = self.refused - first[3]
        spinning = refused > SPIN * max(1, answered)
        self.shedding = standing and not spinning and (self.inflight > worth or self.shedding)
        if not self.shedding:
            return self.ceiling
        return worth if self.ceiling is None else min(worth, self.ceiling)

    def _set_gauge(self) -> None:
        if self._gauge is not None and self.limit is not None:
            self._gauge.set(self.limit)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Tick every TICK on `loop` (nothing to do without a bound in time)."""
        if self.wait is None or self._handle is not None:
            return

        def tick() -> None:
            self.tick()
            self._handle = loop.call_later(TICK, tick)

        self._handle = loop.call_later(TICK, tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class MethodDoor:
    """One method's view of a Door: enter/leave as the door's, `refuse()` counts a refusal
    under the method (the guard's duck type of a refusal: refuse() and message)."""

    __slots__ = ("door", "enter", "leave", "method")

    def __init__(self, door: Door, method: str) -> None:
        self.door = door
        self.enter = door.enter
        self.leave = door.leave
        self.method = method

    @property
    def message(self) -> str:
        return self.door.message

    def refuse(self) -> None:
        self.door.count_refusal(self.method)
