"""The drain's gate: how a draining server sends GOAWAY at once, holding (not refusing) the
calls that come meanwhile, so that grpc has none left to cancel.

What grpc.aio's `stop(grace)` does (grpcio 1.85, measured with two servers on one port): at
once it closes the listener and sends every connection a GOAWAY (a client reconnects within
milliseconds: to another worker of the port, or another replica), and the calls its handlers
already run finish within `grace`. A call that comes after it is refused by the transport and
retried on the new connection by the client's channel itself. But the calls grpc has received
and not yet handed to a handler (they wait in grpc core until the asyncio server asks for the
next one: many, when the event loop is busy) are cancelled: their callers see CANCELLED, which
the standard retry policies do not retry (grpc/grpc#41785).

So the drain holds, rather than refuses, what comes while it starts:

    gate = DrainGate(metrics)          # GuardedRegistrar(grpc_server, gate)
    gate.close()                       # each new call waits at the gate (gate.hold())
    await gate.settled(deadline)       # no new call for SETTLE s: callers wait, grpc holds none
    stopping = asyncio.ensure_future(grpc_server.stop(grace))
    await asyncio.sleep(0)             # its first step: listener closed, GOAWAY sent
    gate.release(serve=True)           # the held calls run, within the grace

A caller that sends one call after another (most do) stops sending while its call is held, so
grpc soon holds no call the server has not taken; the GOAWAY then reaches it before its answer
does, and its next call goes elsewhere. A held call is refused UNAVAILABLE ("the server is
draining", retryable; counted in textserve_drain_refusals_total) only when no grace is left to
run it. The gate is checked by the guard on every method handler (servicers/interceptors.py
GuardedRegistrar), not by an interceptor.

Measured (docs/operations.md): one worker of two SIGTERMed under closed-loop load, callers
without a retry policy. Refusing every new call until the callers went quiet (the drain before
this one) refused 54-66 % of the calls for the whole 30 s grace, since they never went quiet,
and still cancelled a few; grpc's stop() at once cancelled 1-15 calls in five of eight drains;
holding, then stop(): every call OK, the worker gone in 0.2-0.3 s. What this cannot help: a
caller that sends without waiting for answers (open loop) may have a call reach grpc in the
instant its shutdown begins, and see it CANCELLED (5 drains of 26 at 300-400 calls/s).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from textserve.service.metrics import Metrics

# Seconds without a new call before grpc's stop() runs: longer than the gap between two calls of
# a caller still sending (a few ms under load) and than the event loop takes to ask grpc for the
# calls it holds; short, since every held call waits this long.
SETTLE = 0.02
# At most this long holding: callers that do not wait for their answers (open-loop load) never
# go quiet. Each held call waits this long at worst; measured, 0.1 s did no better.
HOLD_MAX = 0.25
_STEP = 0.002  # seconds between two looks at the last held call
# Callers that never went quiet (open loop): new calls are refused (UNAVAILABLE, retryable)
# until none has come for this long, and only then grpc's stop() runs: a call reaching grpc
# in the instant its shutdown begins would be CANCELLED, which nobody retries.
QUIET = 0.1


class DrainGate:
    """Open until close(); from then on the guard holds each new call in hold() until release().
    `held` counts them, `refused` those answered UNAVAILABLE (also in the metrics'
    textserve_drain_refusals_total, given metrics)."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self._counter = None if metrics is None else metrics.drain_refusals
        self.closed = False
        self.held = 0  # calls held since the gate closed
        self.refused = 0  # of them, answered UNAVAILABLE
        self._closed_at = 0.0
        self._last = 0.0  # when the last of them came
        self._released = asyncio.Event()
        self._serve = True
        self._refusing = False  # open-loop callers: refuse new calls at once (refuse_new())

    def close(self) -> None:
        self.closed = True
        self._closed_at = self._last = time.monotonic()

    async def hold(self) -> bool:
        """Wait until release(): whether the call may run (False: refuse it, counted). After
        refuse_new(), a new call is refused at once."""
        self._last = time.monotonic()
        if not self._refusing:
            self.held += 1
            await self._released.wait()
            if self._serve:
                return True
        self.refused += 1
        if self._counter is not None:
            self._counter.inc()
        return False

    async def settled(self, deadline: float) -> bool:
        """True once no call has come for SETTLE seconds (seen twice, a step apart: after a
        blocked event loop, grpc may still hold calls not yet asked for); False after HOLD_MAX
        seconds from close(), or at `deadline` (monotonic), without that."""
        limit = min(deadline, self._closed_at + HOLD_MAX)
        seen = -1.0
        while (now := time.monotonic()) < limit:
            if now - self._last >= SETTLE and self._last == seen:
                return True
            seen = self._last
            await asyncio.sleep(min(_STEP, limit - now))
        return False

    def refuse_new(self) -> None:
        """Run the held calls; answer every new one UNAVAILABLE (counted) from now on."""
        self._refusing = True
        self._serve = True
        self._released.set()

    async def quiet(self, deadline: float) -> None:
        """Return once no call has come for QUIET seconds, or at `deadline` (monotonic)."""
        while (now := time.monotonic()) < deadline:
            wait = self._last + QUIET - now
            if wait <= 0:
                return
            await asyncio.sleep(min(wait, deadline - now))

    def release(self, serve: bool = True) -> None:
        """Let the held calls, and any still to come, run (`serve`) or be refused UNAVAILABLE."""
        self._serve = serve
        self._released.set()
