"""What every front end serves from: one repository, one metrics, the telemetry; no transport."""

from __future__ import annotations

from dataclasses import dataclass, field

from textserve.service.access_log import AccessLog
from textserve.service.config import ServerConfig
from textserve.service.door import Door
from textserve.service.metrics import Metrics
from textserve.service.repository.core import ModelRepository
from textserve.service.tracing import Tracing
from textserve.service.workers.protocol import RelayChange


@dataclass
class Telemetry:
    """What observed() reports a request to besides the metrics: each None when off."""

    tracing: Tracing | None = None  # --otlp-endpoint
    access_log: AccessLog | None = None  # --access-log json


@dataclass
class ServingContext:
    """What a front end gets to build its codec: one repository and one metrics for all."""

    config: ServerConfig
    repository: ModelRepository
    metrics: Metrics
    telemetry: Telemetry = field(default_factory=Telemetry)
    # --workers: applies an admin change on every other worker and returns when they all have
    # (textserve.service.workers.protocol.Coordinator.relay); None in a single process
    relay: RelayChange | None = None
    # the bound on inference requests in flight, gRPC and HTTP together (service/door.py);
    # None: HTTP bounds by --max-concurrent-rpcs alone (a front end without a server)
    door: Door | None = None
