"""The metrics HTTP endpoint: /metrics, /healthz and /readyz on a daemon thread.

Use::

    server, port = start_metrics_server(0, "127.0.0.1", metrics.registry)
    server.set_state(SERVING)                # what /readyz answers (READY_STATES)
    server.close()

service/metrics.py re-exports every name here (callers import them from there).
"""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from types import TracebackType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

# The states /readyz reports, the same as grpc.health.v1's: only SERVING answers 200.
WARMING = "warming"  # listening, models loading and warming up: NOT_SERVING
SERVING = "serving"
NO_MODEL = "no model"  # every model unloaded or removed: NOT_SERVING (Admin stays up)
DRAINING = "draining"  # SIGTERM received: NOT_SERVING while in-flight work finishes
READY_STATES = (WARMING, SERVING, NO_MODEL, DRAINING)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never holds the process at exit


class _IPv6Server(_ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # probes every few seconds would flood the log


class MetricsServer:
    """The HTTP endpoint on a daemon thread: /metrics (the registry), /healthz (live: 200 while
    the process serves HTTP, draining included) and /readyz (200 only while the server is
    SERVING; 503 with the state while warming, draining or without a model). /readyz follows
    the same state as grpc.health.v1, for probes that cannot speak gRPC (Knative, HTTP load
    balancers)."""

    def __init__(self, httpd: WSGIServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        self.port: int = httpd.server_port
        self.state: str = WARMING

    def set_state(self, state: str) -> None:
        """What /readyz reports: one of READY_STATES."""
        if state not in READY_STATES:
            raise ValueError(f"unknown readiness state {state!r}; expected one of {READY_STATES}")
        self.state = state  # one reference assignment: the HTTP threads read it as is

    def app(self, metrics_app: Any) -> Any:
        """The WSGI app: the health paths, else prometheus-client's /metrics app."""

        def wsgi(environ: dict[str, Any], start_response: Any) -> Any:
            path = environ.get("PATH_INFO", "")
            if path == "/healthz":
                return _text(start_response, "200 OK", "ok")
            if path == "/readyz":
                state = self.state
                status = "200 OK" if state == SERVING else "503 Service Unavailable"
                return _text(start_response, status, state)
            return metrics_app(environ, start_response)

        return wsgi

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _text(start_response: Any, status: str, body: str) -> list[bytes]:
    data = (body + "\n").encode()
    start_response(
        status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))]
    )
    return [data]


def start_metrics_server(
    port: int, addr: str, registry: CollectorRegistry
) -> tuple[MetricsServer, int]:
    """Serve ``registry`` at /metrics, and /healthz and /readyz, over HTTP on ``addr:port``
    (port 0: any free one); returns the bound port. Readiness starts as WARMING.

    ``server, port = start_metrics_server(0, "127.0.0.1", metrics.registry)``;
    ``server.set_state(SERVING)``; ``server.close()``.
    """
    if not 0 <= port <= 65535:
        raise ValueError(f"metrics port must be within 0-65535, got {port}")
    server_class = _IPv6Server if ":" in addr else _ThreadingWSGIServer
    try:
        httpd = make_server(addr, port, _not_yet, server_class, handler_class=_QuietHandler)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot serve metrics on {addr}:{port}: {exc.strerror}") from exc
    thread = threading.Thread(target=httpd.serve_forever, name="textserve-metrics", daemon=True)
    server = MetricsServer(httpd, thread)
    httpd.set_app(server.app(make_wsgi_app(registry)))
    thread.start()
    return server, httpd.server_port


def _not_yet(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    return _text(start_response, "503 Service Unavailable", "starting")
