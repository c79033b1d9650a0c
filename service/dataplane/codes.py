"""The data plane's outcome codes: ONE table from the error taxonomy to a neutral code name.

    code_name(OverloadedError("full"))   -> "RESOURCE_EXHAUSTED"
    public_message(KeyError("x"))        -> "internal error (logged on the server)"

The names are the canonical status codes of gRPC (and of Google's APIs), used as plain strings:
the metrics count requests by them, the gRPC codec turns them into grpc.StatusCode
(servicers/status.py) and the HTTP codec into HTTP statuses (http/errors.py). Nothing here
imports a transport.
"""

from __future__ import annotations

import logging

from textserve.service.errors import (
    CancelledError,
    DeadlineExceededError,
    InternalError,
    LoadFailedError,
    ModelNotFoundError,
    NotReadyError,
    OverloadedError,
    ServiceError,
    ValidationError,
)

logger = logging.getLogger(__name__)


# The one table: exception class -> its code name (a grpc.StatusCode member's). Looked up along
# the MRO so a subclass inherits its parent's code.
CODES: dict[type[ServiceError], str] = {
    ValidationError: "INVALID_ARGUMENT",
    ModelNotFoundError: "NOT_FOUND",
    NotReadyError: "UNAVAILABLE",
    OverloadedError: "RESOURCE_EXHAUSTED",
    DeadlineExceededError: "DEADLINE_EXCEEDED",
    CancelledError: "CANCELLED",
    LoadFailedError: "FAILED_PRECONDITION",
    InternalError: "INTERNAL",
    ServiceError: "INTERNAL",
}


def code_name(exc: BaseException) -> str:
    """The code name of an exception; anything outside the taxonomy is INTERNAL."""
    for cls in type(exc).__mro__:
        if cls in CODES:
            return CODES[cls]
    return "INTERNAL"


def public_message(exc: BaseException) -> str:
    """What the caller is told: our own message, never internals of an unexpected exception."""
    if isinstance(exc, ServiceError):
        return str(exc)
    return "internal error (logged on the server)"


def log_unexpected(exc: BaseException, what: str) -> None:
    """Log an exception outside the taxonomy with its traceback (the server goes on)."""
    if not isinstance(exc, ServiceError):
        logger.error("unexpected error in %s", what, exc_info=exc)
