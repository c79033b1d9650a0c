"""grpc core's backlog: the calls grpc has received that the asyncio server has not taken yet,
and the server's own admission of them by time, so that grpc never has to shed them.

grpc.aio asks grpc core for the next call of each method only once its event loop has taken
the previous one (one request outstanding per method, re-armed by the loop); what arrives
meanwhile waits in grpc core, many calls when the loop is busy (the workers' loops on two
shared cores at a hot reload, a load generator on the same cores). grpcio 1.85 sheds that
backlog itself, with the one status nobody retries (src/core/server/server.cc,
RealRequestMatcher, the filter-stack path the chttp2 transport and the aio server use):

- past `grpc.server.max_pending_requests` (1,000 calls) an arriving call is dropped with a
  probability that reaches 1 at `grpc.server.max_pending_requests_hard_limit` (3,000)
  (MatchOrQueue, experiment `optimization_04`, on by default): `FailCallCreation()`, and its
  caller sees CANCELLED (only the promise-based path answers RESOURCE_EXHAUSTED "Too many
  pending requests for this server");
- a call older than `grpc.server_max_unrequested_time_in_server` (30 s) is dropped, likewise
  CANCELLED, when the loop next asks for a call.

Neither reaches a handler, a metric or a log line. So the server (service/server.py) sets
grpc's count to PENDING_CAP, a memory bound it does not reach (about 16 KiB a held call,
measured), and sheds the backlog itself, by time: a call that waited in grpc core longer than
`--max-backlog-wait-ms` is answered RESOURCE_EXHAUSTED (retryable, counted in
`textserve_backlog_refusals_total{bound}`) as soon as the loop takes it, which costs the loop less
than serving it, so the backlog drains instead of growing until grpc cancels it.

How long calls waited is counted, not guessed: grpc core counts each call it starts and ends
(channelz: `callsStarted`, `callsSucceeded + callsFailed`), the guard on every method handler
counts the calls it runs (`in_app`). Calls started but neither ended nor running are the
backlog. A sampler thread (it runs while the loop is stuck) records grpc's started count every
INTERVAL; the calls started before now - max_wait, less those already taken (ended + running),
waited longer than max_wait at least (a count, whatever the order grpc hands them over in),
and the guard refuses that many of the next calls it takes (`shed_until`, compared with its
own count of calls taken, `entries`).

    backlog = Backlog(max_wait=2.0, read=reader, target=0.1)  # reader: channelz_reader(...)
    backlog.start(loop)                                # the sampler thread and the loop's beat
    # the guard, per call: backlog.in_app += 1; backlog.entries += 1 ... refuse while
    # backlog.entries <= backlog.shed_until ... finally: backlog.in_app -= 1
    backlog.stop()

A stall and an overload look alike for max_wait, and a long max_wait (one that outlasts the
stalls of a hot reload on shared cores) makes every call wait that long before it is refused
once the server is past its peak. So the guard also sheds a *standing* backlog down to a short
`target` (`--backlog-target-ms`) when two things hold: calls older than `target` have been
waiting at every sample for STANDING seconds (CoDel's test of a standing queue against a
burst), and calls arrived in the last second faster than the server has served them in any
second of the last minute (x OVERLOAD; channelz's `callsSucceeded`). A stall (a hot reload on
shared cores, a collection, a busy neighbour) slows the server while arrivals go on at the
rate it was serving: it refuses nothing below max_wait, the loop catches up. Overload brings
arrivals the server has never served: it refuses the calls older than `target` as they are
taken, until a sample finds none. The verdict needs SETTLED seconds of served counts (a worker's
first second, warming up, serves less than it can: arrivals would look like overload).

Shedding helps only when a refused caller goes away. Callers in a closed loop (N clients that
send again the moment they are answered, the usual benchmark) come back at once, and their
arrivals rise by the refusals: counted as overload, a few refusals (a stall past max_wait, the
seconds after a profiler attached) would start the target, its refusals keep arrivals above
the served rate, and it never stops (measured: 256 such callers on the trivial model, 21 %
refused, 0.6x the calls served). So shedding to the target *begins* only on arrivals net of
the last second's refusals; once shedding, the arrivals count whole (an open loop's refused
callers do not come back, and its arrivals stay what they were).

When another worker of `--workers N` dies, its clients reconnect to the others: their
arrivals jump at once past anything they served, while the replacement warming up beside them
(on shared cores) slows them, which is the picture of overload. The supervisor tells them
(`PeerLost`, `peer_lost()`): for FAILOVER seconds nothing is shed to the target, only past
max_wait; a backlog still standing after that is judged as any other.

A call grpc dropped itself (past its own caps above, or a stream that failed before its call
was taken) is started and never ends: it would count as waiting forever, and the guard would
refuse as many later calls. When the loop is running (its beat fresh) and took no call for three
intervals, grpc holds none it could hand over: what the counts still show is such dead calls
(`phantom`), left out from then on. Until such a quiet moment, the calls grpc dropped after a
flood past PENDING_CAP or its 30 s limit (calls faster than the loop can even refuse them, or a
loop stuck for 30 s) make the guard refuse as many calls again whenever fewer than that many
arrived within max_wait (retryable, counted).
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

logger = logging.getLogger(__name__)

# grpc core's own cap on the calls it holds for the loop (both its soft and hard limit: a plain
# cap, no random early drops). Above it grpc cancels arriving calls (CANCELLED): it is a memory
# bound, reached only when calls come faster than the loop can even refuse them for seconds.
# About 16 KiB of RSS a held call (measured: 20,000 held, +308 MiB): ~160 MiB at the cap.
PENDING_CAP = 10_000
INTERVAL = 0.05  # seconds between two samples of grpc's counts
# How long calls must have waited longer than the target without a break before the backlog
# counts as standing (overload) rather than a stall the loop will catch up with (a hot reload,
# a collection, a busy neighbour): CoDel's interval (Nichols and Jacobson, 2012), on counts.
STANDING = 1.0
# Arrivals over the last second above this many times the best second of calls served in the
# last minute are overload; below it a standing backlog is a stall the loop will catch up with.
OVERLOAD = 1.1
# Seconds after another worker died during which its load, reconnecting here, is not judged
# overload: the survivors' arrivals double at once while the replacement warms up beside them
# (on shared cores, a stall), and their best second served is their old share. Measured: in 2
# of 7 two-minute soaks on 2 vCPUs the survivor shed 463 and 2,114 calls to the target within 3 s
# of the kill, calls it served a moment later. The age bound (max_wait) still applies.
FAILOVER = 5.0
# Seconds of served counts before arrivals are judged against them (a worker warming up).
SETTLED = 2
REFUSAL_MESSAGE = (
    "the server is overloaded: calls waited longer than {ms:.0f} ms in grpc before it could take "
    "them; retry later, with backoff"
)

# () -> (calls started, calls ended, calls ended OK) by grpc core
Reader = Callable[[], tuple[int, int, int]]


def _server_ids() -> set[int]:
    from grpc._cython import cygrpc  # channelz: grpc core's own counts (no public Python API)

    servers = json.loads(cygrpc.channelz_get_servers(0)).get("server", [])
    return {int(s["ref"]["serverId"]) for s in servers}


def server_ids() -> set[int]:
    """The channelz ids of the grpc servers of this process (empty when channelz is off)."""
    try:
        return _server_ids()
    except Exception:  # grpc without channelz, or a changed private API
        logger.debug("channelz is not available", exc_info=True)
        return set()


def channelz_reader(before: set[int]) -> Reader | None:
    """The counts of the one grpc server created since `before` (server_ids() taken just before
    grpc.aio.server()); None when there is not exactly one (channelz off, another thread)."""
    new = server_ids() - before
    if len(new) != 1:
        logger.warning(
            "grpc's backlog cannot be measured (channelz shows %d new servers): calls grpc holds "
            "are not refused by age (--max-backlog-wait-ms)",
            len(new),
        )
        return None
    from grpc._cython import cygrpc

    server_id = new.pop()

    def read() -> tuple[int, int, int]:
        data: dict[str, Any] = json.loads(cygrpc.channelz_get_server(server_id))["server"]
        data = data.get("data", {})
        succeeded = int(data.get("callsSucceeded", 0))
        ended = succeeded + int(data.get("callsFailed", 0))
        return int(data.get("callsStarted", 0)), ended, succeeded

    return read


class Backlog:
    """grpc's backlog as counts, and how many of the next calls the guard refuses. `in_app`,
    `entries`, `refused` and `beat` are written on the event loop only, `shed_until` by the
    sampler only (single int stores: no lock)."""

    def __init__(
        self,
        max_wait: float | None,
        read: Reader | None = None,
        *,
        target: float | None = None,
        standing: float = STANDING,
        counter: Any = None,
        unhandled: Any = None,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_wait = max_wait if read is not None else None  # None: nothing refused
        # a standing backlog is shed down to `target` (None: only calls past max_wait are)
        self.target = target if target is not None and max_wait and target < max_wait else None
        # the refusals' message and the counter's label, by the bound they are refused for
        self._messages = {
            "max_wait": REFUSAL_MESSAGE.format(ms=(max_wait or 0.0) * 1e3),
            "target": REFUSAL_MESSAGE.format(ms=(self.target or 0.0) * 1e3),
        }
        self.message = self._messages["max_wait"]
        self._standing = standing
        self._standing_since: float | None = None  # since when calls wait longer than target
        # calls served (ended OK) per second, the last minute's seconds: what the server has
        # shown it can serve, against which arrivals are overload or not
        self._served: collections.deque[float] = collections.deque(maxlen=60)
        self._second: tuple[float, int] | None = None  # (when, served) the current second began
        self._bound = "max_wait"  # the bound the next calls are refused for
        self._shedding = False  # calls older than the target are shed
        self._calm_until = 0.0  # no shedding to the target before this (peer_lost)
        self.in_app = 0  # calls the guard runs now
        self.entries = 0  # calls the guard has taken, ever
        self.shed_until = 0  # the guard refuses a call while entries <= shed_until
        self.refused = 0
        self.beat = clock()  # when the loop last ran its heartbeat
        self._read = read
        self._counter = counter
        # calls grpc ended that no handler ran, counted so far (see _count_unhandled)
        self._unhandled = 0
        self._unhandled_counter = unhandled
        self._interval = interval
        self._clock = clock
        # (when, grpc's started count, refusals) at each sample
        self._history: collections.deque[tuple[float, int, int]] = collections.deque()
        self._phantom = 0  # calls grpc started that will never end nor be taken
        self._last: tuple[int, int, bool] | None = None  # (started, taken, loop alive) before
        self._quiet = 0  # consecutive samples without a call taken while the loop ran
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beat_handle: asyncio.TimerHandle | None = None

    @property
    def on(self) -> bool:
        return self.max_wait is not None

    @property
    def unhandled(self) -> int:
        """Calls grpc ended that no handler ran, counted so far (_count_unhandled): under
        overload those grpc.aio's limiter refused, arrivals the guard never saw."""
        return self._unhandled

    def peer_lost(self) -> None:
        """Another worker died: for FAILOVER seconds its clients' calls, arriving here, are
        load this worker has not served yet, not overload (the supervisor's PeerLost)."""
        self._calm_until = self._clock() + FAILOVER

    def refuse(self) -> None:
        """Count one call refused (the guard answers it)."""
        self.refused += 1
        if self._counter is not None:
            self._counter.labels(bound=self._bound).inc()

    def sample(self, now: float | None = None) -> int:
        """Read grpc's counts once and set shed_until; the number of calls to refuse (those
        that waited more than max_wait and are not taken yet)."""
        if self._read is None or self.max_wait is None:
            return 0
        now = self._clock() if now is None else now
        started, ended, succeeded = self._read()
        in_app, entries = self.in_app, self.entries
        taken = ended + in_app
        self._count_unhandled(ended - (entries - in_app))
        # the loop beat since the sample before: three such samples in a row with no call taken
        # (a loop that stalls just after a beat looks alive for one sample more, not two)
        alive = now - self.beat < 1.5 * self._interval
        if self._last is not None:
            last_started, last_taken, last_alive = self._last
            self._quiet = self._quiet + 1 if taken == last_taken and alive and last_alive else 0
            if self._quiet >= 3:  # the loop ran and took nothing: grpc holds no live call
                self._phantom = max(self._phantom, last_started - taken)
        self._phantom = max(0, min(self._phantom, started - taken))
        self._last = (started, taken, alive)
        history = self._history
        history.append((now, started, self.refused))
        cutoff = now - self.max_wait
        while len(history) > 1 and history[1][0] <= min(cutoff, now - 1.0):
            history.popleft()
        if self._second is None:
            self._second = (now, succeeded)
        elif now - self._second[0] >= 1.0:
            self._served.append((succeeded - self._second[1]) / (now - self._second[0]))
            self._second = (now, succeeded)
        # calls started before a moment and not taken yet waited longer than since that moment
        excess = self._started_at(cutoff) - self._phantom - taken
        bound = "max_wait"
        if self.target is not None:
            young = self._started_at(now - self.target) - self._phantom - taken
            if self._shed_to_target(now, started, young > excess, young > 0):
                excess, bound = young, "target"  # overload, not a stall: shed it
        if excess > 0:
            self._bound, self.message = bound, self._messages[bound]
            self.shed_until = entries + excess
        return max(0, excess)

    def _count_unhandled(self, unhandled: int) -> None:
        """Count the calls grpc ended that no handler ran: refused at the door by grpc.aio's
        limiter (`--max-concurrent-rpcs`: most of them under overload, now that the loop takes
        calls as they come), by authentication, UNIMPLEMENTED, or cancelled while held. A
        handler's call leaves in_app before grpc ends it, and `ended` is read first, so the
        difference is never more than the truth: counted as it rises."""
        if unhandled > self._unhandled:
            if self._unhandled_counter is not None:
                self._unhandled_counter.inc(unhandled - self._unhandled)
            self._unhandled = unhandled

    def _shed_to_target(self, now: float, started: int, beyond: bool, waiting: bool) -> bool:
        """Whether calls older than the target are shed now: some wait (`waiting`), more than
        max_wait sheds (`beyond`), they have waited at every sample for STANDING seconds and
        the server is overloaded; to begin, by arrivals the refusals did not bring back."""
        if not waiting:  # the backlog is below the target: a fresh start
            self._standing_since, self._shedding = None, False
            return False
        if self._standing_since is None:
            self._standing_since = now
        if now - self._standing_since < self._standing or not beyond:
            return False
        if now < self._calm_until:  # a peer's load arriving: judged once FAILOVER is over
            self._shedding = False
            return False
        second_ago = self._at(now - 1.0)
        if second_ago is None:  # not sampling for a second yet
            self._shedding = False
            return False
        arrived = started - second_ago[1]
        if not self._shedding:  # refused callers that came straight back are not new load
            arrived -= self.refused - second_ago[2]
        self._shedding = self._overloaded(arrived)
        return self._shedding

    def _overloaded(self, arrived: int) -> bool:
        """`arrived` calls in the last second are more than OVERLOAD x the most the server
        served in any second of the last minute: more than it can serve, not a stall it will
        catch up with (during a stall arrivals go on at the rate the server was serving)."""
        if len(self._served) < SETTLED:
            return False  # not counting served calls for long enough yet
        return arrived > OVERLOAD * max(self._served)

    def _at(self, moment: float) -> tuple[float, int, int] | None:
        """The last sample at or before `moment`; None when sampling has not reached back."""
        for sample in reversed(self._history):
            if sample[0] <= moment:
                return sample
        return None

    def _started_at(self, moment: float) -> int:
        """grpc's started count at the last sample at or before `moment`: the calls that
        arrived before it (hugely negative when sampling has not reached back that far)."""
        sample = self._at(moment)
        return -(1 << 62) if sample is None else sample[1]  # none known to be that old

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """The sampler thread and the loop's heartbeat (nothing when off)."""
        if not self.on or self._thread is not None:
            return

        def beat() -> None:
            self.beat = self._clock()
            self._beat_handle = loop.call_later(self._interval, beat)

        beat()
        self._thread = threading.Thread(target=self._run, name="grpc-backlog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sample()
            except Exception as exc:  # a broken read must not end the sampling in silence
                if not self._stop.is_set():
                    logger.warning("reading grpc's backlog failed (%s): no refusal by age", exc)
                self.max_wait = None
                return

    def stop(self) -> None:
        self._stop.set()
        if self._beat_handle is not None:
            self._beat_handle.cancel()
        if self._thread is not None:
            self._thread.join(timeout=5)
