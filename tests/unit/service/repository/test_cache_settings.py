"""Where a model's cache size comes from: serving.json's "cache_size" (a size or "off"), else
--cache-size; what a bad one says (pure, no model). Then the repository that applies it (real
hand-made versions, real onnxruntime): each serving version answers from its model's cache
with the model's cache series, and a version's entries go once it stops serving."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.handmade import make_version
from tests.serving import run_repository
from textserve.service.engine.cache_size import CacheSize
from textserve.service.metrics import Metrics
from textserve.service.repository.caches import wanted_size
from textserve.service.repository.core import ModelRepository
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


def cache_sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(f"textserve_cache_{name}", labels) or 0.0


def test_each_serving_version_answers_from_its_models_cache_and_a_retired_ones_entries_go(
    tmp_path: Path,
) -> None:
    make_version(tmp_path, "m", 1)  # no serving.json: the flag's size
    make_version(tmp_path, "own", 1)
    (tmp_path / "own" / "serving.json").write_text('{"cache_size": "100 entries"}')
    make_version(tmp_path, "off", 1)
    (tmp_path / "off" / "serving.json").write_text('{"cache_size": "off"}')
    text = ["a good film"]

    async def body(repository: ModelRepository) -> None:
        metrics = repository.metrics
        assert metrics is not None
        sizes = {name: r.cache and r.cache.size for name, r in repository.models.items()}
        assert sizes == {"m": FLAG, "own": CacheSize(entries=100), "off": None}
        assert repository.get("off").cache is None
        old = repository.get("m")
        first = await old.classify(text)
        again = await old.classify(text)
        assert (first.cached_count, again.cached_count) == (0, 1)
        np.testing.assert_array_equal(again.probabilities, first.probabilities)
        assert cache_sample(metrics, "entries", model="m") == 1
        make_version(tmp_path, "m", 2, seed=1)  # other weights
        await repository.reconcile()
        # v1 stopped serving: its entries are gone at once, not when the cache needs room
        assert cache_sample(metrics, "entries", model="m") == 0
        new = await repository.get("m").classify(text)
        assert new.cached_count == 0  # never v1's answer
        assert not np.allclose(new.probabilities, first.probabilities)

    metrics = run_repository(tmp_path, body, cache_size=FLAG)
    assert cache_sample(metrics, "requests_total", model="m", result="hit") == 1
    assert cache_sample(metrics, "requests_total", model="m", result="miss") == 2
