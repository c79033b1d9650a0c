"""The HTTP codec's messages: a request and a response as the route handlers see them, the
route table's entries, and the view of the app a handler gets.

    async def handler(app: AppView, request: Request) -> Response: ...
    Route(handler, open=True)         # a probe: answered without a token

Kept apart from app.py (the ASGI application, which holds the route table) so that the routes
import these and never the app: the import graph has no circle.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from textserve.service.engine.window_options import Windows, parsed
from textserve.service.errors import ValidationError

if TYPE_CHECKING:
    from textserve.service.dataplane.context import ServingContext

JSON = b"application/json"
TEXT = b"text/plain; charset=utf-8"


class AppView(Protocol):
    """What a route handler reads of the app (http/app.py HttpApp)."""

    ctx: ServingContext
    draining: bool
    # /metrics of this process, or with --workers the supervisor's: (Accept header) -> page
    metrics_page: Callable[[str | None], Awaitable[Response]]

    async def readiness_of(self) -> str: ...


class Request:
    """One HTTP request as the route handlers and observed() see it: invocation_metadata()
    and peer() as a grpc context has them, so tracing and the access log work unchanged."""

    __slots__ = ("_peer", "body", "deadline", "headers", "method", "params", "path")

    def __init__(self, scope: dict[str, Any], params: dict[str, str]) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        client = scope.get("client")
        # as grpc spells peers, so that access-log lines read the same for both transports
        if not client:
            self._peer = ""
        elif ":" in client[0]:
            self._peer = f"ipv6:[{client[0]}]:{client[1]}"
        else:
            self._peer = f"ipv4:{client[0]}:{client[1]}"
        self.params = params
        self.body = b""
        self.deadline: float | None = None

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.headers

    def peer(self) -> str:
        return self._peer


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: bytes = JSON
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


def text(status: int, body: str) -> Response:
    return Response(status, (body + "\n").encode(), TEXT)


Handler = Callable[[AppView, Request], Awaitable[Response]]
# An API's own error body: (HTTP status, message, the taxonomy's code name) -> bytes
ErrorShape = Callable[[int, str, str], bytes]


@dataclass(frozen=True)
class Route:
    handler: Handler
    open: bool = False  # answered without a token (the probes)
    body: bool = False  # reads a request body (POST)
    # An inference route's `method` label in the metrics (HttpClassify, ...); None: not one.
    # Inference routes are refused while draining, off with --http-port off, and bounded.
    method: str | None = None
    errors: ErrorShape | None = None  # None: textserve's {"error", "code"} (http/errors.py)

    @property
    def inference(self) -> bool:
        return self.method is not None


def load_json(data: bytes) -> Any:
    """JSON from a client: ValidationError (400) for anything json.loads refuses, the client's
    own faults all: not UTF-8, not JSON, nested past the interpreter's recursion limit (a
    RecursionError), an integer over Python's 4,300 digits (a ValueError). Each was a 500."""
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValidationError(f"the request body is not valid JSON ({exc})") from None
    except RecursionError:
        raise ValidationError("the request body is not valid JSON (nested too deep)") from None
    except ValueError as exc:  # e.g. "Exceeds the limit (4300 digits) for integer string ..."
        raise ValidationError(f"the request body is not valid JSON ({str(exc)[:120]})") from None


def unicode_text(text: str, where: str) -> str:
    """`text` unless it holds a lone surrogate (JSON's "\\ud800" escapes decode to one), which no
    UTF-8 encoder, protobuf or tokenizer takes: ValidationError naming `where`."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValidationError(
                f"{where} is not valid Unicode text (a lone surrogate at character {exc.start})"
            ) from None
    return text


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object; ValidationError (400) naming what is wrong."""
    document = load_json(body)
    if not isinstance(document, dict):
        raise ValidationError(
            f"the request body must be a JSON object, got {type(document).__name__}"
        )
    return document


def typed(document: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    """`document[name]` if it is a `kind` (int: non-negative, under 2**63), `default` when
    absent or null; ValidationError naming the field otherwise."""
    value = document.get(name, default)
    if value is None:
        return default
    if kind is int and (type(value) is not int or value < 0 or value >= 2**63):
        raise ValidationError(f"`{name}` must be a non-negative integer, got {value!r}")
    if kind is not int and not isinstance(value, kind):
        raise ValidationError(f"`{name}` must be a {kind.__name__}, got {type(value).__name__}")
    return value


def windows_field(document: dict[str, Any], default: str) -> Windows | None:
    """A request's `windows` (window_options.parsed): absent or null: the model's default."""
    return parsed(document.get("windows"), default)
