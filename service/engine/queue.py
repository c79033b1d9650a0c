"""The batching policy, pure and synchronous: length buckets, batch formation, time-to-batch, room.

`BatchQueue` holds the waiting items of one model version and decides which of them form the
next batch and when it is due. It knows no asyncio, no threads and no futures: the `Batcher`
(batcher.py) drives it from the event loop and from its inference thread, under its own lock,
and tells it through a callback what to do with a request that was answered or expired while
it waited. So the policy is tested with fake requests and a number for the clock.

Batch formation (see docs/engine.md): the oldest waiting item anchors the batch, so no item
starves; the batch is filled from the anchor's length bucket outwards (nearest lengths first)
while it holds fewer than `max_batch_size` items, `items x longest` stays within
`max_batch_tokens` and, once it has `min_fill` items, padding stays under `max_padding_ratio`.
A batch is due when it is full (items or tokens), when the queue is flushing, or when its
oldest item has waited `max_queue_delay`.

    >>> from textserve.service.config import BatcherConfig
    >>> class Waiting:
    ...     seq, enqueued, deadline = 1, 0.0, None
    ...     def answered(self) -> bool: return False
    >>> queue = BatchQueue(BatcherConfig(max_queue_delay=0.005), "m")
    >>> queue.add(Waiting(), ["a", "bb"], [1, 2])
    >>> queue.time_to_batch(now=0.001)  # the oldest item may wait 4 ms more to fill the batch
    0.004
    >>> [item.payload for item in queue.take(now=0.005, drop=print)]
    ['a', 'bb']
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from textserve.service.config import BatcherConfig
from textserve.service.errors import OverloadedError

BUCKET_WIDTH = 8  # tokens per length bucket: items this close in length pad each other cheaply


class Waiting(Protocol):
    """What the queue reads of a request (the Batcher's _Request)."""

    seq: int  # submission order: the smallest anchors the next batch
    enqueued: float  # when it was queued, on the batcher's clock
    deadline: float | None  # absolute, on the same clock; None: none

    def answered(self) -> bool:
        """Whether the request needs no more rows (cancelled, expired or failed)."""
        ...


R = TypeVar("R", bound=Waiting)


class QueueItem(NamedTuple, Generic[R]):
    request: R
    row: int  # row in the request's outputs
    length: int  # tokens (estimated by whoever submitted the item)
    payload: Any  # what the batch function gets for this item


class BatchQueue(Generic[R]):
    """The waiting items of one model version, in length buckets; not thread-safe."""

    def __init__(self, config: BatcherConfig, name: str = "model") -> None:
        self.config = config
        self.name = name
        self._buckets: dict[int, deque[QueueItem[R]]] = {}
        self._count = 0  # items in buckets (answered ones included until popped)
        self._tokens = 0  # their lengths summed

    def __len__(self) -> int:
        return self._count

    @property
    def tokens(self) -> int:
        """Tokens of the waiting items (their estimated lengths summed)."""
        return self._tokens

    def check_room(self, n: int) -> None:
        """OverloadedError, saying what to do, unless `n` more items fit the queue."""
        limit = self.config.max_queue_size
        if self._count + n <= limit:
            return
        if n > limit:
            raise OverloadedError(
                f"{n} texts can never fit model {self.name!r}'s queue of {limit}; "
                "send fewer texts per request"
            )
        raise OverloadedError(
            f"model {self.name!r} is overloaded: {self._count} texts queued (limit {limit}); "
            "retry later"
        )

    def add(self, request: R, payloads: Sequence[Any], lengths: Sequence[int]) -> None:
        """Queue one request's items: payloads[i] is row i of its outputs, lengths[i] tokens."""
        buckets = self._buckets
        for row, length in enumerate(lengths):
            key = (length - 1) // BUCKET_WIDTH
            bucket = buckets.get(key)
            if bucket is None:
                bucket = buckets[key] = deque()
            bucket.append(QueueItem(request, row, length, payloads[row]))
            self._tokens += length
        self._count += len(lengths)

    def time_to_batch(self, now: float, *, flushing: bool = False) -> float | None:
        """Seconds until a batch is due (<= 0: now): when it is full or flushing, else when its
        oldest item has waited max_queue_delay; None when nothing is queued."""
        if not self._count:
            return None
        config = self.config
        if (
            flushing
            or self._count >= config.max_batch_size
            or self._tokens >= config.max_batch_tokens
        ):
            return 0.0
        oldest = min(bucket[0].request.enqueued for bucket in self._buckets.values())
        return oldest + config.max_queue_delay - now

    def take(self, now: float, drop: Callable[[R, bool], None]) -> list[QueueItem[R]]:
        """Pop the next batch: anchored on the oldest item, filled with the nearest lengths.

        Items of answered requests, and of requests whose deadline is past at `now`, are popped
        on the way and never reach the batch: `drop(request, expired)` is called for each such
        item (expired: its deadline passed; else it was answered) so the caller fails or counts
        it."""
        buckets = self._buckets
        if not buckets:
            return []
        anchor = min(buckets, key=lambda k: buckets[k][0].request.seq)
        # nearest buckets first; at equal distance the shorter one, which cannot raise the
        # batch's padded width as much
        keys = sorted(buckets, key=lambda k: (abs(k - anchor), k))
        config = self.config
        max_items, max_tokens = config.max_batch_size, config.max_batch_tokens
        max_padding, min_fill = config.max_padding_ratio, config.min_fill
        batch: list[QueueItem[R]] = []
        longest = real = 0
        for key in keys:
            bucket = buckets[key]
            while bucket and len(batch) < max_items:
                item = bucket[0]
                request = item.request
                if request.answered():  # cancelled, expired or failed: drop before inference
                    self._pop(bucket, item)
                    drop(request, False)
                    continue
                if request.deadline is not None and request.deadline <= now:
                    self._pop(bucket, item)
                    drop(request, True)
                    continue
                width = max(longest, item.length)
                padded = (len(batch) + 1) * width
                if batch and padded > max_tokens:
                    break
                if len(batch) >= min_fill and real + item.length < (1 - max_padding) * padded:
                    break  # too much padding: this bucket waits for a batch of its own
                self._pop(bucket, item)
                batch.append(item)
                longest = width
                real += item.length
            if not bucket:
                del buckets[key]
            if len(batch) >= max_items:
                break
        return batch

    def _pop(self, bucket: deque[QueueItem[R]], item: QueueItem[R]) -> None:
        bucket.popleft()
        self._count -= 1
        self._tokens -= item.length

    def clear(self) -> list[QueueItem[R]]:
        """Empty the queue; returns every item that was in it (answered ones included)."""
        buckets, self._buckets = self._buckets, {}
        self._count = self._tokens = 0
        return [item for bucket in buckets.values() for item in bucket]
