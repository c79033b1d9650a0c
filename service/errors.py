"""The serving error taxonomy: what core code (batcher, repository, model handles) raises.

Never a transport exception here, and no grpc import: the front ends map these to statuses in
one table (service/servicers/status.py), so a code is decided in exactly one place.
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error a front end reports to its caller (message shown as is)."""


class ValidationError(ServiceError):
    """The request is malformed: no texts, an empty text, too long, a bad option."""


class LimitExceededError(ValidationError):
    """A request over one of the server's per-request limits (`limit`: metric_labels.LIMITS),
    refused by name and counted in textserve_request_limit_refusals_total."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


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
