"""The prologue every front end runs on a request, written once: which model version serves it,
whether over-long texts are truncated, and a multi-label model's decision threshold.

    handle = resolve(repository, call.model, call.version)  # textserve.v1: int, 0 = newest
    handle = resolve(repository, model_name, "3")            # OIP / HTTP paths: a version string
    truncate = truncation(call.truncate)                     # None: the default
    threshold = decision_threshold(handle, call.threshold)   # None: not multi-label

Every operation of the data plane (classify.prologue, infer, the model descriptions) and so
every front end uses these, so an empty name, a version 0 or "", a name too long to be a
model's and the default of `truncate` mean the same thing whichever way a request came.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from textserve import artifact
from textserve.artifact import MAX_VERSION, shown
from textserve.service.errors import ModelNotFoundError, ValidationError

if TYPE_CHECKING:
    from textserve.service.engine.handle import ModelHandle
    from textserve.service.repository.core import ModelRepository

# Model names are folder names of the repository, which no file system lets be longer than 255
# (bytes; so characters too): a longer name in a request cannot name a model. It is refused here,
# before the repository quotes it whole in its NOT_FOUND message.
MAX_NAME_CHARS = 255


def model_name(name: str) -> str | None:
    """A request's model name for ModelRepository.get ("" -> None: the default model);
    ModelNotFoundError, quoting it shortened, for a name too long to be a model's."""
    if len(name) > MAX_NAME_CHARS:
        raise ModelNotFoundError(f"no model named {shown(name)}")
    return name or None


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


def decision_threshold(handle: ModelHandle, requested: float | None) -> float | None:
    """The score a multi-label (sigmoid) model's label must reach to be listed: the request's
    (in (0, 1)), else the manifest's; None for other models. ValidationError for a threshold
    out of range or sent to a model that has no threshold."""
    manifest = handle.manifest
    if requested is not None:
        if not (math.isfinite(requested) and 0.0 < requested < 1.0):
            raise ValidationError(f"threshold must be between 0 and 1 (exclusive), got {requested}")
        if manifest.activation != "sigmoid":
            raise ValidationError(
                f"threshold is for multi-label models (activation sigmoid); model "
                f"{shown(handle.name)} is {manifest.activation} (leave threshold unset)"
            )
        return requested
    return manifest.decision_threshold if manifest.activation == "sigmoid" else None
