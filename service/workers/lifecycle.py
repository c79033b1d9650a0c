"""The life of one worker of `textserve serve --workers N`, as its supervisor sees it: states,
legal transitions, the restart backoff and the heartbeat's decisions.

A worker's state changes only through Lifecycle's methods, each of which names the states it
may leave from and refuses any other (IllegalTransition), so the life of a worker reads in one
place:

    NEW --spawned--> STARTING --warm--> WARM --reported(serving)--> SERVING <---> NO_MODEL
                         |                |                            |             |
                         +---reported(draining)--> DRAINING <----------+-------------+
    WARM, SERVING, NO_MODEL, DRAINING --killed_unresponsive--> UNRESPONSIVE
    any live state (STARTING .. UNRESPONSIVE) --died--> RESTARTING --spawned--> STARTING
                                              --stopped--> STOPPED  (the server is stopping)
                                              --failed--> FAILED    (it stops the server)
    RESTARTING --restart_cancelled--> STOPPED  (the server stops before the restart is due)

SERVING, NO_MODEL and DRAINING are the worker's own /readyz states (Readiness messages); the
server's readiness is server_readiness() of every worker's state. The text the log shows
(`worker 2 (pid 123): warm`) is Lifecycle.text, derived from the state and what ended the
process. Pure: no processes, pipes, signals or clock; the supervisor (supervisor.py) passes the
time in and does what the answers say.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field

from textserve.service import metrics_server as readyz

BACKOFF_FIRST = 0.5  # seconds before restarting a worker that died; doubles per death in a row
BACKOFF_MAX = 10.0
CRASH_LIMIT = 5  # worker deaths within CRASH_WINDOW seconds that stop the server
CRASH_WINDOW = 60.0


class WorkerState(enum.Enum):
    NEW = "new"  # not spawned yet
    STARTING = "starting"  # spawned: loading and warming its models (no heartbeat yet)
    WARM = "warm"  # said Warm: waits for Serve (every worker warm)
    SERVING = readyz.SERVING
    NO_MODEL = readyz.NO_MODEL  # every model unloaded or removed
    DRAINING = readyz.DRAINING  # it drains: forwarded SIGTERM, or on its own
    UNRESPONSIVE = "unresponsive"  # silent past --worker-timeout: killed by the supervisor
    RESTARTING = "restarting"  # died: spawned again at restart_at
    STOPPED = "stopped"  # exited while the server stops (or its restart was called off)
    FAILED = "failed"  # exited in a way that stops the server (before it served; a crash loop)


NEW, STARTING, WARM = WorkerState.NEW, WorkerState.STARTING, WorkerState.WARM
SERVING, NO_MODEL, DRAINING = WorkerState.SERVING, WorkerState.NO_MODEL, WorkerState.DRAINING
UNRESPONSIVE, RESTARTING = WorkerState.UNRESPONSIVE, WorkerState.RESTARTING
STOPPED, FAILED = WorkerState.STOPPED, WorkerState.FAILED

LIVE = (STARTING, WARM, SERVING, NO_MODEL, DRAINING, UNRESPONSIVE)  # a process runs
ANSWERING = (WARM, SERVING, NO_MODEL, DRAINING)  # past its startup: pinged, killed when silent
# The readiness a worker may report, and the states it may report it from. DRAINING also from
# STARTING: a signal during startup. A report of the state it is in changes nothing.
REPORTED = {
    SERVING: (WARM, SERVING, NO_MODEL),
    NO_MODEL: (WARM, SERVING, NO_MODEL),
    DRAINING: (STARTING, WARM, SERVING, NO_MODEL, DRAINING),
}


class IllegalTransition(RuntimeError):
    """A state change the life of a worker does not have."""


class Beat(enum.Enum):
    """The heartbeat's decision for one worker."""

    WAIT = "wait"  # nothing to do now
    PING = "ping"  # send Ping(pinged(now))
    KILL = "kill"  # silent past the timeout: killed_unresponsive(), then kill the process


def backoff(deaths_in_a_row: int) -> float:
    """Seconds before a worker that died is restarted: 0.5 s doubling per death in a row."""
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2**deaths_in_a_row)


def describe_exit(code: int) -> str:
    """A process's exit as the log says it: "status 1", "signal SIGKILL"."""
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"


def server_readiness(states: Iterable[WorkerState], stopping: bool) -> str:
    """The server's /readyz state (readyz.READY_STATES) from every worker's: serving only while
    every worker serves; no model while none is warming or down and one has no model."""
    found = set(states)
    if stopping:
        return readyz.DRAINING
    if found == {SERVING}:
        return readyz.SERVING
    if NO_MODEL in found and found <= {SERVING, NO_MODEL}:
        return readyz.NO_MODEL
    return readyz.WARMING  # a worker starts or restarts: not every worker is warm


@dataclass
class CrashWindow:
    """The server's worker deaths (any worker) within the last CRASH_WINDOW seconds."""

    deaths: list[float] = field(default_factory=list)

    def record(self, now: float) -> bool:
        """A worker died at `now`; True when that makes a crash loop (stop the server)."""
        self.deaths = [t for t in self.deaths if now - t < CRASH_WINDOW] + [now]
        return len(self.deaths) >= CRASH_LIMIT


@dataclass
class Lifecycle:
    state: WorkerState = NEW
    failure: str = ""  # what it said when its startup failed (StartupFailed)
    exit_code: int | None = None  # how its process ended (multiprocessing's exitcode)
    killed: bool = False  # it ended UNRESPONSIVE: the supervisor killed it
    delay: float = 0.0  # RESTARTING: the backoff it waits
    restart_at: float | None = None  # RESTARTING: when to spawn it again
    deaths_in_a_row: int = 0  # reset once it serves
    heard_at: float = 0.0  # when it last said anything (a Pong, or any other message)
    pinged_at: float = 0.0
    pings: int = 0  # the last Ping's sequence number (continues across restarts)

    def _move(self, to: WorkerState, *sources: WorkerState) -> None:
        if self.state not in sources:
            raise IllegalTransition(
                f"{self.state.value} -> {to.value} (only from "
                + " or ".join(s.value for s in sources)
                + ")"
            )
        self.state = to

    # -- transitions --------------------------------------------------------------------------

    def spawned(self, now: float) -> None:
        """Its process started (the first time, or again after it died)."""
        self._move(STARTING, NEW, RESTARTING)
        self.failure, self.exit_code, self.killed = "", None, False
        self.restart_at, self.heard_at = None, now

    def warm(self) -> None:
        """It said Warm: models loaded and warm, waiting for Serve."""
        self._move(WARM, STARTING)

    def reported(self, readiness: str) -> bool:
        """It said Readiness(readiness); False when that changes nothing (the state it is in,
        or it is UNRESPONSIVE: being killed, what it said before is moot)."""
        if self.state is UNRESPONSIVE:
            return False
        to = next((s for s in REPORTED if s.value == readiness), None)
        if to is None:
            raise IllegalTransition(f"{self.state.value} -> {readiness!r}: not a readiness")
        if to is self.state:
            return False
        self._move(to, *REPORTED[to])
        if to is SERVING:
            self.deaths_in_a_row = 0
        return True

    def startup_failed(self, message: str) -> None:
        """It said why it cannot start (StartupFailed); its exit follows. No state change."""
        if self.state not in LIVE:
            raise IllegalTransition(f"{self.state.value}: a startup failure from no process")
        self.failure = message

    def killed_unresponsive(self) -> None:
        """The heartbeat's KILL: recorded before the process is killed, so that its death,
        however soon it is seen, counts as unresponsive rather than as a crash."""
        self._move(UNRESPONSIVE, *ANSWERING)

    def died(self, code: int, now: float) -> float:
        """Its process ended while the server serves: restarted after the backoff, returned."""
        self._ended(RESTARTING, code)
        self.delay = backoff(self.deaths_in_a_row)
        self.deaths_in_a_row += 1
        self.restart_at = now + self.delay
        return self.delay

    def stopped(self, code: int) -> None:
        """Its process ended while the server stops."""
        self._ended(STOPPED, code)

    def failed(self, code: int) -> None:
        """Its process ended in a way that stops the server (before the server ever served,
        or the death that makes a crash loop)."""
        self._ended(FAILED, code)

    def restart_cancelled(self) -> None:
        """The server stops while this one waits for its restart: it stays down."""
        self._move(STOPPED, RESTARTING)
        self.restart_at = None

    def _ended(self, to: WorkerState, code: int) -> None:
        killed = self.state is UNRESPONSIVE
        self._move(to, *LIVE)
        self.exit_code, self.killed = code, killed

    # -- bookkeeping and decisions (the current time passed in) -------------------------------

    def heard(self, now: float) -> None:
        """It said something (any message is a sign of life)."""
        self.heard_at = now

    def silence(self, now: float) -> float:
        return now - self.heard_at

    def heartbeat(self, now: float, timeout: float, interval: float) -> Beat:
        """What to do about it now: a worker past its startup (loading a large model may take
        longer than any timeout) is pinged every `interval` seconds and killed once it has said
        nothing for `timeout` seconds (stopped, or its event loop blocked)."""
        if self.state not in ANSWERING:
            return Beat.WAIT
        if self.silence(now) > timeout:
            return Beat.KILL
        if now - self.pinged_at >= interval:
            return Beat.PING
        return Beat.WAIT

    def pinged(self, now: float) -> int:
        """A Ping goes out now: its sequence number."""
        self.pings += 1
        self.pinged_at = now
        return self.pings

    def restart_due(self, now: float) -> bool:
        return self.state is RESTARTING and self.restart_at is not None and self.restart_at <= now

    # -- what it reads as ---------------------------------------------------------------------

    @property
    def live(self) -> bool:
        return self.state in LIVE

    @property
    def catches_up(self) -> bool:
        """Still starting: an admin change reaches it from the log once it is warm (Serve)."""
        return self.state in (STARTING, WARM)

    @property
    def restart_reason(self) -> str:
        """The label `reason` of textserve_worker_restarts_total (workers/metrics.py)."""
        return "unresponsive" if self.killed else "exited"

    @property
    def how(self) -> str:
        """How its process ended ("status 1", "signal SIGKILL"); "" while it runs."""
        return "" if self.exit_code is None else describe_exit(self.exit_code)

    @property
    def text(self) -> str:
        """The state as the log shows it: "warm", "died with signal SIGKILL; restarting in
        0.5s", "stopped (status 0)"."""
        if self.state is RESTARTING:
            said = f": {self.failure}" if self.failure else ""
            if self.killed:
                said = " (unresponsive)"
            return f"died with {self.how}{said}; restarting in {self.delay:.1f}s"
        if self.state is STOPPED:
            return f"stopped ({self.how})"
        if self.state is FAILED:
            return f"exited with {self.how}"
        return self.state.value
