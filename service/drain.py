"""The drain's gate: once a drain begins, a call that arrives is answered UNAVAILABLE ("the
server is draining", retryable) by the server itself, instead of racing grpc's shutdown.

grpc's own stop() cancels the calls it has received but not yet handed to a handler: their
callers see CANCELLED, which the standard retry policies do not retry. So the server closes
this gate first, answers every new call itself while the clients still send (load balancers
and DNS take a few seconds to move them away), and calls grpc's stop() only once no new call
has come for QUIET seconds (or the grace period is over):

    gate = DrainGate()                 # the first interceptor of the server
    gate.close()                       # drain: new calls get UNAVAILABLE from here on
    await gate.quiet(deadline)         # until QUIET s without a new call, or the deadline
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import grpc

from textserve.service.servicers.interceptors import refusal_handler

# Seconds without a new call before grpc's stop() runs: longer than the gap between two calls
# of a client that is still sending (a few ms under load), short enough not to slow down a
# server nobody calls.
QUIET = 0.1
# Answered as usual while draining: health says NOT_SERVING itself (that is how a balancer
# learns to stop), reflection is harmless.
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
MESSAGE = "the server is draining (shutting down); retry on another server or connection"

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class DrainGate(grpc.aio.ServerInterceptor):
    def __init__(self) -> None:
        self.closed = False
        self.refused = 0  # calls answered UNAVAILABLE since the gate closed
        self._last = 0.0  # when the last of them came

    def close(self) -> None:
        self.closed = True
        self._last = time.monotonic()

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if not self.closed or handler is None:
            return handler
        if handler_call_details.method.startswith(OPEN_SERVICES):
            return handler
        self.refused += 1
        self._last = time.monotonic()
        return refusal_handler(handler, grpc.StatusCode.UNAVAILABLE, MESSAGE)

    async def quiet(self, deadline: float) -> None:
        """Return once no call has come for QUIET seconds, or at `deadline` (monotonic)."""
        while (now := time.monotonic()) < deadline:
            wait = self._last + QUIET - now
            if wait <= 0:
                return
            await asyncio.sleep(min(wait, deadline - now))
