"""textserve.v1 Classify over the HTTP port (POST /v1/classify), for callers without a gRPC stack
and for `textserve classify --server http://HOST:PORT`.

    with HttpClient("http://127.0.0.1:8000") as client:
        result = client.classify(["a good film"], top_k=2)    # the same ClassifyResult as Client's
        print(result.predictions[0].label)

Errors raise ClientError with the gRPC code name the server's JSON answer carries (the same
taxonomy as over gRPC); a server that cannot be reached is UNAVAILABLE.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from google.protobuf import json_format

from textserve.messages import classify_request as _request
from textserve.results import ClassifyResult, ClientError, to_result
from textserve.v1 import classifier_pb2 as pb

SCHEMES = ("http://", "https://")


def is_http(address: str) -> bool:
    """Whether a --server value names the HTTP port rather than a gRPC target."""
    return address.startswith(SCHEMES)


class HttpClient:
    """Classify over HTTP/JSON; safe to share between threads (one connection per call)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 60.0,
        token: str | None = None,
        tls: bool = False,
        ca: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        server_name: str | None = None,
        connections: int = 1,  # accepted for Client's signature: every call connects anew
    ) -> None:
        if not is_http(url):
            raise ValueError(f"an HTTP server address starts with http:// or https://: {url!r}")
        if server_name is not None:
            raise ValueError("--tls-server-name is for gRPC; over HTTP the URL's host is checked")
        self.url = url.rstrip("/") + "/v1/classify"
        self.timeout = timeout
        self._headers = {"Content-Type": "application/json", "Request-Timeout": f"{timeout:g}"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._context: ssl.SSLContext | None = None
        if url.startswith("https://") or tls or ca or cert:
            self._context = ssl.create_default_context(cafile=str(ca) if ca else None)
            if cert is not None and key is not None:
                self._context.load_cert_chain(str(cert), str(key))

    def classify(
        self,
        texts: Sequence[str],
        *,
        model: str | None = None,
        version: int | None = None,
        truncate: bool | None = None,
        top_k: int = 0,
        all_scores: bool = False,
        text_pairs: Sequence[str] | None = None,
        threshold: float | None = None,
    ) -> ClassifyResult:
        message = _request(
            texts, model, version, truncate, top_k, all_scores, "", text_pairs, threshold
        )
        document: dict[str, Any] = {
            "texts": list(message.texts),
            "model": message.model,
            "version": message.version,
            "top_k": message.top_k,
            "all_scores": message.all_scores,
        }
        if message.HasField("truncate"):
            document["truncate"] = message.truncate
        if message.text_pairs:
            document["text_pairs"] = list(message.text_pairs)
        if message.HasField("threshold"):
            document["threshold"] = message.threshold
        request = urllib.request.Request(
            self.url, data=json.dumps(document).encode(), headers=self._headers, method="POST"
        )
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout, context=self._context
            ) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            raise _error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ClientError("UNAVAILABLE", f"cannot reach {self.url}: {reason}") from None
        response = json_format.ParseDict(body, pb.ClassifyResponse(), ignore_unknown_fields=True)
        return to_result(response)

    def close(self) -> None:
        pass  # nothing held between calls

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _error(exc: urllib.error.HTTPError) -> ClientError:
    """The server's JSON error ({"error", "code"}) as a ClientError."""
    try:
        document = json.loads(exc.read())
        return ClientError(str(document["code"]), str(document["error"]))
    except (ValueError, KeyError, TypeError):
        return ClientError("UNKNOWN", f"HTTP {exc.code} {exc.reason}")
