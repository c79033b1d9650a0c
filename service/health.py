"""grpc.health.v1 for a server that drains: the statuses, and Watch streams that end on drain."""

from __future__ import annotations

from typing import Any

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# The initial metadata key of a Check answer naming the worker of `--workers N` that gave it
# ("INDEX/PID"): which process a connection landed on, for tests and for operators.
WORKER_KEY = "textserve-worker"


class DrainingHealthServicer(HealthServicer):
    """grpc.health.v1 as grpc_health's servicer, except that a Watch stream ends once the server
    drains: the watcher gets NOT_SERVING, then the stream closes with OK. With the stock
    servicer an open Watch (a load balancer's or a sidecar's) is an RPC in flight that holds
    `server.stop(grace)` until the grace period runs out and is then cancelled.
    With --workers, Check answers carry the worker in initial metadata (WORKER_KEY)."""

    worker: str | None = None  # "INDEX/PID" of this worker process; None: a single process

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> Any:
        if self.worker is not None:
            await context.send_initial_metadata(((WORKER_KEY, self.worker),))
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
