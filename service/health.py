"""grpc.health.v1 for a server that drains: the statuses, and Watch streams that end on drain."""

from __future__ import annotations

from typing import Any

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from textserve.spread import WORKER_KEY, WORKERS_KEY

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# With --workers N a Check answer's initial metadata names the worker that gave it (WORKER_KEY,
# "INDEX/PID") and N (WORKERS_KEY): which process a connection landed on, for clients that
# spread their connections (textserve.spread), tests and operators.
__all__ = ["WORKERS_KEY", "WORKER_KEY", "DrainingHealthServicer"]


class DrainingHealthServicer(HealthServicer):
    """grpc.health.v1 as grpc_health's servicer, except that a Watch stream ends once the server
    drains: the watcher gets NOT_SERVING, then the stream closes with OK. With the stock
    servicer an open Watch (a load balancer's or a sidecar's) is an RPC in flight that holds
    `server.stop(grace)` until the grace period runs out and is then cancelled.
    With --workers, Check answers carry the worker and the count in initial metadata
    (WORKER_KEY, WORKERS_KEY)."""

    worker: str | None = None  # "INDEX/PID" of this worker process; None: a single process
    workers = 1  # how many the server runs

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> Any:
        if self.worker is not None:
            await context.send_initial_metadata(
                ((WORKER_KEY, self.worker), (WORKERS_KEY, str(self.workers)))
            )
        return await super().Check(request, context)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        condition = self._server_watchers[request.service]
        last = None
        try:
            async with condition:
                while True:
                    status = self._server_status.get(
                        request.service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
                    )
                    if status != last:
                        await context.write(health_pb2.HealthCheckResponse(status=status))
                        last = status
                    if self._gracefully_shutting_down:
                        return
                    await condition.wait()
        finally:
            self._server_watchers.pop(request.service, None)  # as the stock servicer does

    async def enter_graceful_shutdown(self) -> None:
        await super().enter_graceful_shutdown()
        # Watchers of a name that has no status (SERVICE_UNKNOWN) were not notified above.
        for condition in list(self._server_watchers.values()):
            async with condition:
                condition.notify_all()
