"""The serving error taxonomy: what core code (batcher, repository, model handles) raises.

Never a transport exception here, and no grpc import: the front ends map these to statuses in
one table (service/servicers/status.py), so a code is decided in exactly one place.
"""

from __future__ import annotations

# How much of a request-provided name or version an error message or log line quotes: enough to
# recognise it, never the megabytes a client may send (a 3 MB name made a 3 MB log line, and a
# status message too big for grpc's metadata limit, so the client saw that instead of NOT_FOUND).
QUOTE_CHARS = 64


def shorten(text: str, limit: int = QUOTE_CHARS) -> str:
    """`text` quoted for a message or log line (as !r would), cut to `limit` characters.

    >>> shorten("tiny")
    "'tiny'"
    >>> shorten("x" * 100, limit=3)
    "'xxx…' (100 characters)"
    """
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit] + '…'!r} ({len(text)} characters)"


class ServiceError(Exception):
    """Base of every error a front end reports to its caller (message shown as is)."""


class ValidationError(ServiceError):
    """The request is malformed: no texts, an empty text, too long, a bad option."""


class ModelNotFoundError(ServiceError):
    """No such model or version; the message lists what exists."""


class NotReadyError(ServiceError):
    """The model exists but is not serving (loading, failed, or the server is draining)."""


class OverloadedError(ServiceError):
    """The model's queue is full: refused at once rather than queued without bound."""


class DeadlineExceededError(ServiceError):
    """The caller's deadline passed before its texts reached the model."""


class CancelledError(ServiceError):
    """The caller went away; its texts were dropped before inference."""


class LoadFailedError(ServiceError):
    """A model version asked for (admin LoadModel) was refused: broken files; see the reason."""


class InternalError(ServiceError):
    """Something failed that the caller cannot fix (inference error...)."""
