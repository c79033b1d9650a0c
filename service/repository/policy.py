"""Version policies: which versions of each model the server serves, as Triton's version_policy.

A policy is written ``latest`` / ``latest:N`` (the N newest versions that load; the default is
``latest:1``), ``all`` (every version that loads) or ``specific:V[,V...]`` (just those).
``--version-policy`` takes one or more whitespace-separated entries, ``POLICY`` for every model
and ``NAME=POLICY`` for one model::

    --version-policy latest:1                  # the default
    --version-policy "all tiny=specific:3,4"   # every version, except tiny: 3 and 4 only

A model directory may also hold ``serving.json`` (``{"version_policy": "latest:2"}``), read
again at each scan, so that a publisher can pin or roll back without touching the server.
Precedence: a ``NAME=`` flag entry, then the model's serving.json, then the flag's default.

It may also set the model's response cache (``{"cache_size": "64MiB"}``, or ``"off"``; see
docs/cache.md), which takes precedence over ``--cache-size``.

Pure (stdlib only): the repository applies policies; this module only parses and selects.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from textserve.service.engine.cache_size import CacheSize, CacheSizeError
from textserve.service.engine.window_options import OFF, Windows, parsed
from textserve.service.errors import ValidationError

POLICY_FILE = "serving.json"
KINDS = ("latest", "all", "specific")
SYNTAX = "latest[:N], all or specific:V[,V...]"


class PolicyError(ValueError):
    """A version policy that cannot be parsed; the message shows the expected syntax."""


@dataclass(frozen=True)
class VersionPolicy:
    kind: str = "latest"  # latest | all | specific
    count: int = 1  # latest: how many of the newest versions to serve
    versions: tuple[int, ...] = ()  # specific: the versions to serve

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise PolicyError(f"unknown version policy {self.kind!r}; use {SYNTAX}")
        if self.kind == "latest" and self.count < 1:
            raise PolicyError(f"latest:N needs N of 1 or more, got {self.count}")
        if self.kind == "specific" and (not self.versions or min(self.versions) < 1):
            raise PolicyError("specific needs one or more positive versions, e.g. specific:1,3")

    def select(self, candidates: Iterable[int]) -> list[int]:
        """The versions to serve among `candidates` (the servable versions on disk), newest
        first. A candidate that then fails to load is dropped and `select` asked again, so
        ``latest:1`` falls back to the newest version that works.

        >>> VersionPolicy("latest", 2).select([1, 4, 2, 3])
        [4, 3]
        >>> VersionPolicy("specific", versions=(1, 9)).select([1, 2])
        [1]
        """
        ordered = sorted(set(candidates), reverse=True)
        if self.kind == "latest":
            return ordered[: self.count]
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered

    def __str__(self) -> str:
        if self.kind == "latest":
            return f"latest:{self.count}"
        if self.kind == "specific":
            return "specific:" + ",".join(str(v) for v in sorted(self.versions))
        return "all"


LATEST = VersionPolicy()


def parse_policy(text: str) -> VersionPolicy:
    """``latest``, ``latest:N``, ``all`` or ``specific:V[,V...]``.

    >>> parse_policy("specific:3,1")
    VersionPolicy(kind='specific', count=1, versions=(1, 3))
    """
    kind, _, arg = text.strip().partition(":")
    kind = kind.strip().lower()
    try:
        if kind == "latest":
            return VersionPolicy("latest", int(arg) if arg.strip() else 1)
        if kind == "all" and not arg.strip():
            return VersionPolicy("all")
        if kind == "specific":
            versions = tuple(sorted({int(v) for v in arg.split(",") if v.strip()}))
            return VersionPolicy("specific", versions=versions)
    except ValueError as exc:
        if isinstance(exc, PolicyError):
            raise
        raise PolicyError(f"version policy {text!r}: {exc}; use {SYNTAX}") from None
    raise PolicyError(f"version policy {text!r} is not one of {SYNTAX}")


@dataclass(frozen=True)
class PolicySet:
    """The policies given on the command line: one default and per-model overrides."""

    default: VersionPolicy = LATEST
    # (name, policy) pairs, sorted: a tuple keeps the frozen config hashable
    models: tuple[tuple[str, VersionPolicy], ...] = ()

    def for_model(self, name: str, from_file: VersionPolicy | None = None) -> VersionPolicy:
        """The policy of model `name`: its flag entry, else its serving.json, else the default."""
        return dict(self.models).get(name) or from_file or self.default

    def __str__(self) -> str:
        return " ".join([str(self.default), *(f"{n}={p}" for n, p in self.models)])


def parse_policies(text: str) -> PolicySet:
    """``--version-policy``: whitespace-separated ``POLICY`` / ``NAME=POLICY`` entries.

    >>> str(parse_policies("all tiny=latest:2"))
    'all tiny=latest:2'
    """
    default = LATEST
    models: dict[str, VersionPolicy] = {}
    seen_default = False
    for entry in text.split():
        name, sep, spec = entry.rpartition("=")
        if sep and name not in ("", "*", "default"):
            if name in models:
                raise PolicyError(f"--version-policy names model {name!r} twice")
            models[name] = parse_policy(spec)
            continue
        if seen_default:
            raise PolicyError(
                f"--version-policy has two default policies ({default} and {spec}); "
                "give other entries as NAME=POLICY"
            )
        default, seen_default = parse_policy(spec), True
    return PolicySet(default, tuple(sorted(models.items())))


@dataclass(frozen=True)
class ServingFile:
    """A model's serving.json: what it sets (None: not set, the flags decide)."""

    version_policy: VersionPolicy | None = None
    # "cache_size": "64MiB" / "10000entries" (docs/cache.md), or "off": this model has none
    cache_size: CacheSize | None = None
    cache_off: bool = False
    # "windows": true / {"aggregate": "mean", "stride": 32}: long texts by windows unless a
    # request says otherwise (dataplane/windows.py); false or absent: cut
    windows: Windows | None = None


FILE_KEYS = ("version_policy", "cache_size", "windows")


def read_serving_file(model_dir: Path) -> ServingFile:
    """``model_dir/serving.json``, an empty ServingFile if there is no such file; PolicyError
    if it is unreadable or malformed."""
    path = Path(model_dir) / POLICY_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ServingFile()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PolicyError(f"{path} is unreadable: {exc}") from None
    if not isinstance(data, dict) or set(data) - set(FILE_KEYS):
        raise PolicyError(
            f'{path} must be a JSON object like {{"version_policy": "latest:1"}} '
            f"(keys: {', '.join(FILE_KEYS)})"
        )
    policy = None
    spec = data.get("version_policy")
    if spec is not None:
        if not isinstance(spec, str):
            raise PolicyError(f"{path}: version_policy must be a string: {SYNTAX}")
        try:
            policy = parse_policy(spec)
        except PolicyError as exc:
            raise PolicyError(f"{path}: {exc}") from None
    try:
        windows = parsed(data.get("windows"), "mean")
    except ValidationError as exc:
        raise PolicyError(f"{path}: {exc}") from None
    if windows is OFF:
        windows = None
    size = data.get("cache_size")
    if size is None:
        return ServingFile(policy, windows=windows)
    if not isinstance(size, str | int) or isinstance(size, bool):
        raise PolicyError(f'{path}: cache_size must be a string such as "64MiB", or "off"')
    if str(size).strip().lower() == "off":
        return ServingFile(policy, cache_off=True, windows=windows)
    try:
        return ServingFile(policy, CacheSize.parse(str(size)), windows=windows)
    except CacheSizeError as exc:
        raise PolicyError(f"{path}: {exc}") from None
