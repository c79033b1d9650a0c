"""textserve: serve transformer text classifiers over gRPC with onnxruntime.

The client library, for applications that classify against a running server::

    from textserve import Client
    with Client("127.0.0.1:50051") as client:
        print(client.classify(["a gripping, beautifully acted film"]).predictions[0].label)

`AsyncClient` (asyncio), `AdminClient` (load/unload versions) and `ClientError` come from here
too. The server (`textserve.service`), training (`textserve.model`, needs the `train` extra),
export (`textserve.export`) and the benchmark (`textserve.bench`) are subpackages; the
`textserve` console script drives them all (`textserve --help`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["AdminClient", "AsyncClient", "ClassifyResult", "Client", "ClientError", "Prediction"]

if TYPE_CHECKING:
    from textserve.client import (
        AdminClient,
        AsyncClient,
        ClassifyResult,
        Client,
        ClientError,
        Prediction,
    )


def __getattr__(name: str) -> Any:
    # Lazily: `import textserve.cli` (the console script) and the server's modules must not
    # pay for grpc's client stack they may never use.
    if name in __all__:
        from textserve import client

        return getattr(client, name)
    raise AttributeError(f"module 'textserve' has no attribute {name!r}")
