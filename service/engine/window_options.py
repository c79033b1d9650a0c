"""How long texts are split into windows instead of cut (dataplane/windows.py does it): the
option a request, or a model's serving.json, gives. Below the repository, which keeps each
model's default."""

from __future__ import annotations

from typing import Any, NamedTuple

from textserve.service.errors import ValidationError

AGGREGATES = ("mean", "max", "first")


class Windows(NamedTuple):
    """A request's (or a model's) choice to split long texts instead of cutting them."""

    aggregate: str = "mean"  # AGGREGATES; "off": no windows, whatever the model's default
    stride: int = 0  # tokens each window shares with the one before it


OFF = Windows("off", 0)  # a request that turns a model's default windows off


def checked(aggregate: str, stride: int) -> Windows:
    """Windows from a request's fields ("off": OFF); ValidationError naming a bad one."""
    aggregate = aggregate or "mean"
    if aggregate == "off":
        return OFF
    if aggregate not in AGGREGATES:
        raise ValidationError(
            f"windows.aggregate must be one of {', '.join(AGGREGATES)} or off, got "
            f"{aggregate[:40]!r}"
        )
    if not 0 <= stride < 2**31:
        raise ValidationError(f"windows.stride must be a non-negative integer, got {stride}")
    return Windows(aggregate, stride)


def parsed(value: Any, default_aggregate: str) -> Windows | None:
    """A JSON `windows` value: absent or null: None (the model's default); false: OFF; true: the
    defaults; {"aggregate": ..., "stride": ...}. ValidationError otherwise."""
    if value is None:
        return None
    if value is False:
        return OFF
    if value is True:
        return checked(default_aggregate, 0)
    if not isinstance(value, dict) or set(value) - {"aggregate", "stride"}:
        raise ValidationError(
            '`windows` must be true, false or an object {"aggregate": "mean", "stride": 0}'
        )
    aggregate = value.get("aggregate") or default_aggregate
    stride = value.get("stride", 0)
    if not isinstance(aggregate, str):
        raise ValidationError(f"windows.aggregate must be a string, got {aggregate!r}")
    if type(stride) is not int:
        raise ValidationError(f"windows.stride must be a non-negative integer, got {stride!r}")
    return checked(aggregate, stride)
