"""The response cache on its own (pure: no model, no loop): sizes, hits, texts that tokenize
alike, the bound in counted bytes and in real memory, retiring a version."""

from __future__ import annotations

import gc
import sys
import tracemalloc

import numpy as np
import pytest

from textserve.service.engine.cache import (
    TEXT_OVERHEAD,
    CacheSize,
    CacheSizeError,
    Hit,
    ResponseCache,
)

ROW = np.array([0.1, 0.7, 0.2], np.float32)


class Seen:
    def __init__(self) -> None:
        self.lookups: list[tuple[int, int]] = []
        self.sizes: list[tuple[int, int]] = []

    def on_lookups(self, hits: int, misses: int) -> None:
        self.lookups.append((hits, misses))

    def on_size(self, nbytes: int, entries: int) -> None:
        self.sizes.append((nbytes, entries))


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("64MiB", CacheSize(bytes=64 * 2**20)),
        ("500MB", CacheSize(bytes=500 * 10**6)),
        ("1048576", CacheSize(bytes=2**20)),
        (" 2 gib ", CacheSize(bytes=2 * 2**30)),
        ("10000entries", CacheSize(entries=10000)),
        ("1 entry", CacheSize(entries=1)),
    ],
)
def test_sizes_in_bytes_or_entries(text: str, size: CacheSize) -> None:
    assert CacheSize.parse(text) == size
    assert CacheSize.parse(str(size)) == size


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "a cache of 0 holds nothing"),
        ("0MiB", "a cache of 0 holds nothing"),
        ("-1", "is not a size in bytes such as 64MiB"),
        ("1.5MiB", "is not a size"),
        ("64XB", "is not a size"),
        ("", "is not a size"),
        ("2048GiB", "use 1 byte to 1TiB"),
        ("9" * 100, "is not a size"),
    ],
)
def test_bad_sizes_say_what_is_expected(text: str, message: str) -> None:
    with pytest.raises(CacheSizeError, match=message):
        CacheSize.parse(text)


def test_a_stored_text_is_a_hit_with_its_row_and_lengths() -> None:
    seen = Seen()
    cache = ResponseCache(CacheSize.parse("1MiB"), seen)
    view = cache.view(version=3, max_length=4)
    assert view.lookup(["a good film"], truncate=True) == [None]
    view.store("a good film", [5, 9, 2, 7], 6, ROW)  # 6 tokens, cut to 4
    (hit,) = view.lookup(["a good film"], truncate=True)
    assert isinstance(hit, Hit) and (hit.num_tokens, hit.full_tokens) == (4, 6)
    assert hit.probabilities.tolist() == ROW.tolist() and hit.probabilities.dtype == np.float32
    assert not hit.probabilities.flags.writeable  # a shared row: nobody may change it
    # truncate=false: over max_length is refused by the queue, never answered from the cache
    assert view.lookup(["a good film"], truncate=False) == [None]
    assert cache.entries == 1 and seen.sizes[-1] == (cache.nbytes, 1)
    view.count(1, 2)
    assert seen.lookups == [(1, 2)]


def test_texts_that_tokenize_alike_share_one_answer() -> None:
    cache = ResponseCache(CacheSize.parse("1MiB"))
    view = cache.view(version=1, max_length=8)
    view.store("Great film", [3, 4], 2, ROW)
    row = view.by_ids([3, 4])  # "great film" tokenizes alike (a lowercasing normalizer)
    assert row is not None and row.tolist() == ROW.tolist()
    assert view.by_ids([4, 3]) is None
    one = cache.nbytes
    view.store("great film", [3, 4], 2, row)
    assert len(cache._answers) == 1 and cache.entries == 2
    # the second text costs its own entry, not another row
    assert cache.nbytes - one == sys.getsizeof("great film") + TEXT_OVERHEAD


def test_versions_never_see_each_others_entries_and_a_retired_one_is_gone_at_once() -> None:
    cache = ResponseCache(CacheSize.parse("1MiB"))
    old, new = cache.view(version=1, max_length=8), cache.view(version=2, max_length=8)
    old.store("a text", [1, 2], 2, ROW)
    assert new.lookup(["a text"], truncate=True) == [None] and new.by_ids([1, 2]) is None
    again = cache.view(version=1, max_length=8)  # version 1 loaded again: a fresh epoch
    assert again.lookup(["a text"], truncate=True) == [None]
    old.retire()
    assert old.lookup(["a text"], truncate=True) == [None] and old.by_ids([1, 2]) is None
    assert (cache.entries, cache.nbytes) == (0, 0)
    old.store("late", [7], 1, ROW)  # a request that picked the retired version finishing
    assert cache.entries == 0


def test_least_recently_used_texts_go_first_and_answers_with_their_last_text() -> None:
    cache = ResponseCache(CacheSize(entries=2))
    view = cache.view(version=1, max_length=8)
    view.store("a", [1], 1, ROW)
    view.store("A", [1], 1, ROW)  # alike: the same answer
    assert view.lookup(["a"], truncate=True)[0] is not None  # "a" is now the newest
    view.store("b", [2], 1, ROW)  # evicts "A", the least recently used; the answer stays
    assert [view.lookup([t], truncate=True)[0] is not None for t in "aAb"] == [True, False, True]
    assert view.by_ids([1]) is not None
    view.store("c", [3], 1, ROW)  # evicts "a": its answer had no other text
    assert view.by_ids([1]) is None and len(cache._answers) == 2


def test_resize_evicts_down_to_the_new_bound() -> None:
    cache = ResponseCache(CacheSize(entries=10))
    view = cache.view(version=1, max_length=8)
    for i in range(10):
        view.store(f"text {i}", [i], 1, ROW)
    cache.resize(CacheSize(entries=3))
    assert cache.entries == 3 and view.lookup(["text 9"], truncate=True)[0] is not None


def test_unique_texts_past_the_bound_keep_the_real_memory_within_it() -> None:
    """A hostile caller sending only unique texts: the cache fills, then evicts. Measured with
    tracemalloc (every allocation the cache keeps, the texts included), not just counted."""
    bound = 2**20
    cache = ResponseCache(CacheSize(bytes=bound))
    view = cache.view(version=1, max_length=128)
    rng = np.random.default_rng(0)
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        peak_counted = 0
        for i in range(8_000):  # ~8x what fits
            text = f"unique text number {i} " + "x" * int(rng.integers(0, 200))
            ids = rng.integers(0, 30_000, int(rng.integers(1, 128))).tolist()
            view.store(text, ids, len(ids), rng.random(3, dtype=np.float32))
            peak_counted = max(peak_counted, cache.nbytes)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert peak_counted <= bound
    assert cache.entries > 900  # it did fill (about 1 KiB an entry here)
    assert held <= bound, f"the cache holds {held} bytes, over its {bound}-byte bound"
    assert held > 0.8 * bound  # and the counting is not so cautious that the bound is wasted
