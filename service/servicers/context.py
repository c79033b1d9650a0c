"""The shape of a gRPC front end's `register` function (the serving context is the data plane's)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc

from textserve.service.dataplane.context import ServingContext

# register(server, ctx) -> the full names of the services it added (for health and reflection)
Register = Callable[[grpc.aio.Server, ServingContext], Sequence[str]]
