"""Where a model's cache size comes from: serving.json's "cache_size" (a size or "off"), else
--cache-size; what a bad one says (pure, no model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from textserve.service.engine.cache_size import CacheSize
from textserve.service.repository.caches import wanted_size
from textserve.service.repository.policy import (
    PolicyError,
    ServingFile,
    VersionPolicy,
    read_serving_file,
)

FLAG = CacheSize.parse("64MiB")


@pytest.mark.parametrize(
    ("text", "expected", "size"),
    [
        (None, ServingFile(), FLAG),
        ('{"version_policy": "latest:2"}', ServingFile(VersionPolicy("latest", 2)), FLAG),
        ('{"cache_size": "16MiB"}', ServingFile(cache_size=CacheSize(bytes=16 << 20)), None),
        ('{"cache_size": 1000}', ServingFile(cache_size=CacheSize(bytes=1000)), None),
        ('{"cache_size": "500 entries"}', ServingFile(cache_size=CacheSize(entries=500)), None),
        ('{"cache_size": "off"}', ServingFile(cache_off=True), None),
    ],
)
def test_serving_json_sets_the_cache_over_the_flag(
    tmp_path: Path, text: str | None, expected: ServingFile, size: CacheSize | None
) -> None:
    if text is not None:
        (tmp_path / "serving.json").write_text(text)
    found = read_serving_file(tmp_path)
    assert found == expected
    assert wanted_size(FLAG, found) == (size or found.cache_size)
    assert wanted_size(None, ServingFile()) is None  # neither: no cache


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"cache_size": "0"}', r"serving.json: cache size '0': a cache of 0 holds nothing"),
        ('{"cache_size": "lots"}', r"serving.json: cache size 'lots' is not a size in bytes"),
        ('{"cache_size": true}', r'cache_size must be a string such as "64MiB", or "off"'),
        ('{"cache": "1MiB"}', r"must be a JSON object like .* \(keys: version_policy, cache_size"),
    ],
)
def test_a_bad_cache_size_in_serving_json_says_what_is_expected(
    tmp_path: Path, text: str, message: str
) -> None:
    (tmp_path / "serving.json").write_text(text)
    with pytest.raises(PolicyError, match=message):
        read_serving_file(tmp_path)
