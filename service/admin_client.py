"""A client for the textserve.v1.Admin service (servers run with --enable-admin).

    with AdminClient("127.0.0.1:50051") as admin:
        admin.load_model("default", 3)          # serve version 3 beside the policy's choice
        admin.unload_model("default", 4)        # roll back: retire 4, the policy picks again
        admin.reload_repository()               # scan now instead of at the next poll

Errors arrive as service.client.ClientError (code name + the server's message): NOT_FOUND,
FAILED_PRECONDITION (the version was refused, the message says why), UNIMPLEMENTED (the server
runs without --enable-admin).
"""

from __future__ import annotations

from pathlib import Path

import grpc

from service.client import BlockingClient
from service.security import open_channel
from textserve.v1 import admin_pb2 as pb
from textserve.v1 import admin_pb2_grpc as pb_grpc

# Loading waits for the version's checks and warm-up, unloading for its requests to finish
# (up to the server's --grace-period, 30 s by default): allow more than a classify call.
DEFAULT_TIMEOUT = 120.0


class AdminClient(BlockingClient):
    """Blocking Admin client over one channel (its own, or `channel` if given). TLS and token
    arguments as for service.client.Client."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        channel: grpc.Channel | None = None,
        tls: bool = False,
        ca: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        server_name: str | None = None,
        token: str | None = None,
    ) -> None:
        own = channel is None
        if channel is None:
            channel = open_channel(
                target, tls=tls, ca=ca, cert=cert, key=key, server_name=server_name
            )
        super().__init__(
            target,
            channel,
            timeout=timeout,
            token=token,
            own_channel=own,
        )
        self.stub = pb_grpc.AdminStub(self._channel)

    def load_model(self, name: str, version: int | None = None) -> pb.LoadModelResponse:
        return self._call(self.stub.LoadModel, pb.LoadModelRequest(name=name, version=version or 0))

    def unload_model(self, name: str, version: int | None = None) -> pb.UnloadModelResponse:
        return self._call(
            self.stub.UnloadModel, pb.UnloadModelRequest(name=name, version=version or 0)
        )

    def reload_repository(self) -> pb.ReloadRepositoryResponse:
        return self._call(self.stub.ReloadRepository, pb.ReloadRepositoryRequest())
