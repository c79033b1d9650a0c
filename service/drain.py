"""The drain's gate: once a drain begins, a call that arrives is answered UNAVAILABLE ("the
server is draining", retryable) by the server itself, instead of racing grpc's shutdown.

grpc's own stop() cancels the calls it has received but not yet handed to a handler: their
callers see CANCELLED, which the standard retry policies do not retry. So the server closes
this gate first, answers every new call itself while the clients still send (load balancers
and DNS take a few seconds to move them away), and calls grpc's stop() only once no new call
has come for QUIET seconds (or the grace period is over). The gate is checked by the guard on
every method handler (servicers/interceptors.py GuardedRegistrar), not by an interceptor:

    gate = DrainGate()                 # GuardedRegistrar(grpc_server, gate)
    gate.close()                       # drain: new calls get UNAVAILABLE from here on
    await gate.quiet(deadline)         # until QUIET s without a new call, or the deadline
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from textserve.service.metrics import Metrics

# Seconds without a new call before grpc's stop() runs: longer than the gap between two calls
# of a client that is still sending (a few ms under load), short enough not to slow down a
# server nobody calls.
QUIET = 0.1


class DrainGate:
    """Open until close(); the guard calls refuse() for each call it turns away meanwhile,
    counted in `refused` and, given one, the metrics' textserve_drain_refusals_total."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self._counter = None if metrics is None else metrics.drain_refusals
        self.closed = False
        self.refused = 0  # calls answered UNAVAILABLE since the gate closed
        self._last = 0.0  # when the last of them came

    def close(self) -> None:
        self.closed = True
        self._last = time.monotonic()

    def refuse(self) -> None:
        self.refused += 1
        self._last = time.monotonic()
        if self._counter is not None:
            self._counter.inc()

    async def quiet(self, deadline: float) -> None:
        """Return once no call has come for QUIET seconds, or at `deadline` (monotonic)."""
        while (now := time.monotonic()) < deadline:
            wait = self._last + QUIET - now
            if wait <= 0:
                return
            await asyncio.sleep(min(wait, deadline - now))
