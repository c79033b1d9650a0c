"""The prologue every front end runs on a request, written once: which model version serves it,
and whether over-long texts are truncated.

    handle = resolve(repository, request.model, request.version)  # textserve.v1: int, 0 = newest
    handle = resolve(repository, model_name, "3")                  # OIP / HTTP: a version string
    truncate = truncation(request.truncate if request.HasField("truncate") else None)

textserve.v1 (unary and stream), the Open Inference Protocol over gRPC and every HTTP route use
these, so an empty name, a version 0 or "", a name too long to be a model's and the default of
`truncate` mean the same thing whichever way a request came.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textserve import artifact
from textserve.artifact import MAX_VERSION, shown
from textserve.service.errors import ModelNotFoundError
from textserve.service.servicers.status import model_name

if TYPE_CHECKING:
    from textserve.service.engine.handle import ModelHandle
    from textserve.service.repository.core import ModelRepository

# Over-long texts are cut to the model's max_length unless the request says truncate=false
# (then they are refused with INVALID_ARGUMENT): ClassifyRequest.truncate's documented default.
DEFAULT_TRUNCATE = True


def parse_version(model: str, version: str) -> int | None:
    """A version string (OIP, HTTP paths) as the repository takes it: "" -> None (the newest
    ready one); else a canonical decimal in 1..2**63-1, as a repository folder name must be
    (NOT_FOUND otherwise: no version can have that name)."""
    if not version:
        return None
    number = artifact.parse_version(version)
    if number is None:
        raise ModelNotFoundError(
            f"model {shown(model)} has no version {shown(version)}: versions are decimal "
            f"integers from 1 to {MAX_VERSION}, written without sign or leading zeros"
        )
    return number


def resolve(repository: ModelRepository, model: str, version: int | str | None) -> ModelHandle:
    """The handle that serves a request for `model` ("": the default model) at `version`
    (0, "" or None: its newest ready version). Raises ModelNotFoundError, NotReadyError."""
    number = parse_version(model, version) if isinstance(version, str) else version or None
    return repository.get(model_name(model), number)


def truncation(requested: bool | None) -> bool:
    """What a request's `truncate` means: its value when it gave one, else DEFAULT_TRUNCATE."""
    return DEFAULT_TRUNCATE if requested is None else requested
