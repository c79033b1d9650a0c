"""The HTTP status of every error of the taxonomy, derived from the one table of
servicers/status.py (exception -> gRPC code), and the JSON body that says what went wrong.

    status, body = error_body(exc)    # (404, b'{"error": "model \\'x\\' not found ...", ...}')
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from textserve.service.dataplane.codes import code_name, log_unexpected, public_message

if TYPE_CHECKING:
    from textserve.service.http.messages import ErrorShape

# gRPC code name -> HTTP status, as grpc-gateway and Google's APIs map them; 499 is the
# client-closed-request status nginx logs (the client went away, nobody reads the answer).
HTTP_STATUS: dict[str, int] = {
    "OK": 200,
    "INVALID_ARGUMENT": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "FAILED_PRECONDITION": 409,
    "ABORTED": 409,
    "ALREADY_EXISTS": 409,
    "RESOURCE_EXHAUSTED": 429,
    "CANCELLED": 499,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}


def http_status(exc: BaseException) -> int:
    """The HTTP status an exception answers: its gRPC code's; 500 for anything unexpected."""
    return HTTP_STATUS.get(code_name(exc), 500)


def json_error(message: str, code: str) -> bytes:
    """The body of every error answer: `error` (what Triton's and KServe's clients read) and
    the gRPC `code` name the same failure has over gRPC."""
    return json.dumps({"error": message, "code": code}).encode()


def textserve_error(status: int, message: str, code: str) -> bytes:
    """textserve's own error shape (an ErrorShape): json_error's body."""
    return json_error(message, code)


def error_body(
    exc: BaseException, what: str, shape: ErrorShape = textserve_error
) -> tuple[int, bytes]:
    """(status, body in `shape`) for `exc` raised while serving `what`; logs the unexpected."""
    log_unexpected(exc, what)
    status = http_status(exc)
    return status, shape(status, public_message(exc), code_name(exc))
