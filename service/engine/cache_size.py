"""How much a model's response cache may hold: `--cache-size`, serving.json's "cache_size".

Pure (stdlib only): the serving configuration parses it at the edge, before anything loads.

    CacheSize.parse("64MiB")          # CacheSize(bytes=67108864, entries=None)
    CacheSize.parse("10000entries")   # CacheSize(bytes=None, entries=10000)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

UNITS = {
    "": 1, "b": 1, "bytes": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9,
    "kib": 2**10, "mib": 2**20, "gib": 2**30,
}  # fmt: skip
MAX_BYTES = 2**40  # a typo guard: 1 TiB of cached rows is not a setting anyone means
SIZE_SYNTAX = "a size in bytes such as 64MiB, 500MB or 1048576, or a count such as 10000entries"


class CacheSizeError(ValueError):
    """A cache size that cannot be used; the message says what is expected."""


@dataclass(frozen=True)
class CacheSize:
    """How much one model's cache may hold: `bytes` (as counted here) or `entries` (texts)."""

    bytes: int | None = None
    entries: int | None = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.entries is None):
            raise CacheSizeError("a cache size is bytes or entries, one of the two")
        if self.bytes is not None and not 1 <= self.bytes <= MAX_BYTES:
            raise CacheSizeError(f"a cache of {self.bytes} bytes: use 1 byte to 1TiB")
        if self.entries is not None and self.entries < 1:
            raise CacheSizeError(f"a cache of {self.entries} entries: use at least 1")

    @classmethod
    def parse(cls, text: str) -> CacheSize:
        """`64MiB`, `500MB`, `1048576` (bytes), `10000entries`; CacheSizeError otherwise (0
        too: leave the cache off by not setting a size).

        >>> CacheSize.parse("64MiB"), CacheSize.parse("10000 entries")
        (CacheSize(bytes=67108864, entries=None), CacheSize(bytes=None, entries=10000))
        """
        match = re.fullmatch(r"\s*([0-9]{1,15})\s*([A-Za-z]*)\s*", text)
        unit = match.group(2).lower() if match else ""
        if match is None or (unit not in UNITS and unit not in ("entries", "entry")):
            raise CacheSizeError(f"cache size {text[:40]!r} is not {SIZE_SYNTAX}")
        number = int(match.group(1))
        if number == 0:
            raise CacheSizeError(
                f"cache size {text.strip()!r}: a cache of 0 holds nothing; to serve without a "
                "cache, do not set a size"
            )
        if unit.startswith("entr"):
            return cls(entries=number)
        return cls(bytes=number * UNITS[unit])

    def __str__(self) -> str:
        if self.entries is not None:
            return f"{self.entries} entries"
        size = self.bytes or 0
        for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if size % factor == 0:
                return f"{size // factor}{unit}"
        return f"{size} bytes"
