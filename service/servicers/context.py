"""What a front end gets to build its servicer, and the shape of its `register` function."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from textserve.service.config import ServerConfig
from textserve.service.metrics import Metrics
from textserve.service.repository.core import ModelRepository


@dataclass
class ServingContext:
    """What a front end gets to build its servicer: one repository and one metrics for all."""

    config: ServerConfig
    repository: ModelRepository
    metrics: Metrics


# register(server, ctx) -> the full names of the services it added (for health and reflection)
Register = Callable[[grpc.aio.Server, ServingContext], Sequence[str]]
