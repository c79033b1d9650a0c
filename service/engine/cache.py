"""The response cache: a repeated text is answered without tokenizing or running the model.

Opt-in per model (`--cache-size`, or `"cache_size"` in the model's serving.json). One
ResponseCache per model and worker process (each worker of `--workers N` has its own: nothing
is shared between processes), shared by the model's versions; each loaded version sees it
through its own VersionCache, whose `epoch` is in every key. What is cached is the value the
model computes, the probabilities row; everything a request changes afterwards (top_k,
all_scores, the label picked) is applied to the row as for a miss.

The key is (model, version, the text's token ids after truncation). No request option changes
the row today: truncate only decides whether an over-long text is cut (its ids are then the
cut ones) or refused (never cached); the activation is the version's, so the epoch covers it;
a request's threshold, top_k and all_scores are applied to the row afterwards. Sentence pairs
are not cached (the handle skips the cache for them). An option that did change the row would
have to join the key.

Two tables, one lock, one bound:
- texts: (epoch, text) -> the entry of its ids, LRU. On the event loop, a request's texts are
  looked up here before the queue: an exact repeat costs a dict lookup, no tokenizing.
- answers: (epoch, token ids) -> the probabilities row. The inference thread, which tokenizes
  every text that was not answered on the loop, looks the ids up here: a text that tokenizes
  like a cached one is answered without running the model (and remembered under its own text).
Every answer is referenced by the texts that led to it and dropped with the last of them, so
the bound (bytes, counted as below, or text entries) holds whatever the texts: a caller sending
only unique texts fills the cache and then evicts the oldest. Never stale: `retire()` (the
version stops serving: hot reload, unload, retire) drops its entries at once and ignores late
stores; a version loaded again gets a new epoch.

    cache = ResponseCache(CacheSize.parse("64MiB"))
    view = cache.view(version=3)
    view.lookup(["a good film"], truncate=True)   # [None]: a miss, goes to the queue
    view.store("a good film", [5, 9, 2], 3, probabilities)   # the inference thread, after the run
    view.lookup(["a good film"], truncate=True)   # [Hit(probabilities, num_tokens=3, ...)]
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np

from textserve.service.engine.cache_size import CacheSize, CacheSizeError

__all__ = ["CacheSize", "CacheSizeError", "Hit", "ResponseCache", "VersionCache"]

# Bytes an entry takes beyond its key and value objects (CPython 3.11, 64-bit): the dict slot
# and the OrderedDict's link, the key tuple, the entry object. Measured with tracemalloc over
# 20k entries with churn (tests/unit/service/engine/test_cache.py checks the bound holds for real).
TEXT_OVERHEAD = 320
ANSWER_OVERHEAD = 240


class CacheObserver(Protocol):
    """Where the cache reports itself (service/metrics.py's CacheMetrics)."""

    def on_lookups(self, hits: int, misses: int) -> None: ...

    def on_size(self, nbytes: int, entries: int) -> None: ...


class Hit(NamedTuple):
    probabilities: np.ndarray  # float32 (num_labels,), read-only
    num_tokens: int  # tokens the model saw
    full_tokens: int  # tokens before truncation


class _Answer:
    __slots__ = ("cost", "refs", "row")

    def __init__(self, row: bytes, cost: int) -> None:
        self.row = row  # the probabilities row, float32 bytes
        self.refs = 0  # text entries that lead here
        self.cost = cost


class _Text:
    __slots__ = ("answer", "answer_key", "cost", "full_tokens", "num_tokens")

    def __init__(
        self, answer_key: tuple[int, bytes], answer: _Answer, num_tokens: int, full_tokens: int
    ) -> None:
        self.answer_key = answer_key
        self.answer = answer
        self.num_tokens = num_tokens
        self.full_tokens = full_tokens
        self.cost = 0


_epochs = itertools.count(1)  # one per VersionCache: a version loaded again never sees old rows


class ResponseCache:
    """One model's cache in this process: a bound, the two tables, one lock (the event loop
    looks up, the inference thread stores)."""

    def __init__(self, size: CacheSize, observer: CacheObserver | None = None) -> None:
        self.size = size
        self._observer = observer
        self._lock = threading.Lock()
        self._texts: OrderedDict[tuple[int, str], _Text] = OrderedDict()
        self._answers: dict[tuple[int, bytes], _Answer] = {}
        self._live: set[int] = set()  # epochs of the views still serving
        self.nbytes = 0

    def view(self, version: int, max_length: int) -> VersionCache:
        """The cache as one loaded version sees it (a fresh epoch)."""
        epoch = next(_epochs)
        with self._lock:
            self._live.add(epoch)
        return VersionCache(self, epoch, version, max_length)

    @property
    def entries(self) -> int:
        """Cached texts."""
        return len(self._texts)

    def resize(self, size: CacheSize) -> None:
        """A new bound (serving.json changed): evicts down to it at once."""
        with self._lock:
            self.size = size
            self._evict()
        self._report()

    def clear(self) -> None:
        with self._lock:
            self._texts.clear()
            self._answers.clear()
            self.nbytes = 0
        self._report()

    # -- called through VersionCache -------------------------------------------------------

    def _lookup(self, epoch: int, texts: Sequence[str]) -> list[Hit | None]:
        found: list[Hit | None] = []
        with self._lock:
            table = self._texts
            for text in texts:
                entry = table.get((epoch, text))
                if entry is None:
                    found.append(None)
                    continue
                table.move_to_end((epoch, text))
                row = np.frombuffer(entry.answer.row, np.float32)
                found.append(Hit(row, entry.num_tokens, entry.full_tokens))
        return found

    def _by_ids(self, epoch: int, ids: Sequence[int]) -> np.ndarray | None:
        with self._lock:
            answer = self._answers.get((epoch, _ids_key(ids)))
        return None if answer is None else np.frombuffer(answer.row, np.float32)

    def _store(
        self,
        epoch: int,
        text: str,
        ids: Sequence[int],
        full_tokens: int,
        probabilities: np.ndarray,
    ) -> None:
        key = _ids_key(ids)
        row = np.ascontiguousarray(probabilities, np.float32).tobytes()
        with self._lock:
            if epoch not in self._live or (epoch, text) in self._texts:
                return  # retired meanwhile (its requests still finish), or stored already
            answer_key = (epoch, key)
            answer = self._answers.get(answer_key)
            if answer is None:
                cost = sys.getsizeof(key) + sys.getsizeof(row) + ANSWER_OVERHEAD
                answer = self._answers[answer_key] = _Answer(row, cost)
                self.nbytes += cost
            entry = _Text(answer_key, answer, len(ids), int(full_tokens))
            entry.cost = sys.getsizeof(text) + TEXT_OVERHEAD
            answer.refs += 1
            self._texts[(epoch, text)] = entry
            self.nbytes += entry.cost
            self._evict()
        self._report()

    def _retire(self, epoch: int) -> None:
        with self._lock:
            self._live.discard(epoch)
            for key in [k for k in self._texts if k[0] == epoch]:
                self._drop(key)
        self._report()

    def _evict(self) -> None:
        """Oldest texts out until within the bound (under the lock)."""
        limit_bytes, limit_entries = self.size.bytes, self.size.entries
        while self._texts and (
            (limit_bytes is not None and self.nbytes > limit_bytes)
            or (limit_entries is not None and len(self._texts) > limit_entries)
        ):
            self._drop(next(iter(self._texts)))

    def _drop(self, key: tuple[int, str]) -> None:
        entry = self._texts.pop(key)
        self.nbytes -= entry.cost
        entry.answer.refs -= 1
        if not entry.answer.refs:
            del self._answers[entry.answer_key]
            self.nbytes -= entry.answer.cost

    def _report(self) -> None:
        if self._observer is not None:
            self._observer.on_size(self.nbytes, len(self._texts))

    def count(self, hits: int, misses: int) -> None:
        if self._observer is not None and (hits or misses):
            self._observer.on_lookups(hits, misses)


def _ids_key(ids: Sequence[int]) -> bytes:
    # uint32: the tokenizers library's id type; 4 bytes a token, hashable, compared whole.
    return np.asarray(ids, np.uint32).tobytes()


class VersionCache:
    """The cache as one loaded version sees it: its own epoch in every key."""

    def __init__(self, cache: ResponseCache, epoch: int, version: int, max_length: int) -> None:
        self.cache = cache
        self.epoch = epoch
        self.version = version
        self.max_length = max_length

    def lookup(self, texts: Sequence[str], truncate: bool) -> list[Hit | None]:
        """On the event loop, before the queue: the cached answer of each text, or None. A text
        over max_length tokens with truncate=false is a miss: the queue refuses it as usual."""
        found = self.cache._lookup(self.epoch, texts)
        if not truncate:
            limit = self.max_length
            found = [None if hit and hit.full_tokens > limit else hit for hit in found]
        return found

    def by_ids(self, ids: Sequence[int]) -> np.ndarray | None:
        """On the inference thread: the row of a text that tokenized to `ids` (after
        truncation), or None."""
        return self.cache._by_ids(self.epoch, ids)

    def store(
        self, text: str, ids: Sequence[int], full_tokens: int, probabilities: np.ndarray
    ) -> None:
        """Remember `text`'s answer: its ids after truncation, its length before, its row."""
        self.cache._store(self.epoch, text, ids, full_tokens, probabilities)

    def count(self, hits: int, misses: int) -> None:
        self.cache.count(hits, misses)

    def retire(self) -> None:
        """This version stops serving: its entries go now, later stores are ignored."""
        self.cache._retire(self.epoch)
