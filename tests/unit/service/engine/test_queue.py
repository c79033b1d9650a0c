"""Unit tests of the pure batching policy (BatchQueue) with fake requests and a number as clock:
batch formation, time to batch, room and counts; no asyncio, no threads."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count
from typing import Any

import pytest

from textserve.service.config import BatcherConfig
from textserve.service.engine.queue import BUCKET_WIDTH, BatchQueue
from textserve.service.errors import OverloadedError

_seq = count(1)


@dataclass
class Fake:
    """A request as the queue sees it."""

    enqueued: float = 0.0
    deadline: float | None = None
    done: bool = False
    seq: int = field(default_factory=lambda: next(_seq))

    def answered(self) -> bool:
        return self.done


def queue(**config: Any) -> BatchQueue[Fake]:
    return BatchQueue(BatcherConfig(**config), "m")


def add(q: BatchQueue[Fake], *lengths: int, **request: Any) -> Fake:
    fake = Fake(**request)
    q.add(fake, [f"{fake.seq}:{row}" for row in range(len(lengths))], list(lengths))
    return fake


def take(q: BatchQueue[Fake], now: float = 0.0) -> list[tuple[int, int]]:
    """(request seq, length) of each item of the next batch; drops must not happen."""

    def drop(request: Fake, expired: bool) -> None:
        raise AssertionError(f"unexpected drop of {request}")

    return [(item.request.seq, item.length) for item in q.take(now, drop)]


def test_counts_follow_add_take_and_clear() -> None:
    q = queue()
    assert len(q) == 0 and q.tokens == 0 and not q
    first = add(q, 3, 5)
    add(q, 7)
    assert (len(q), q.tokens) == (3, 15)
    batch = q.take(0.0, lambda r, e: None)
    assert [(i.request, i.row, i.length, i.payload) for i in batch[:2]] == [
        (first, 0, 3, f"{first.seq}:0"),
        (first, 1, 5, f"{first.seq}:1"),
    ]
    assert (len(q), q.tokens) == (0, 0)
    add(q, 4, 4)
    assert [item.length for item in q.clear()] == [4, 4]
    assert (len(q), q.tokens, q.take(0.0, lambda r, e: None)) == (0, 0, [])


def test_room_takes_exactly_the_limit_and_says_what_to_do() -> None:
    q = queue(max_queue_size=4)
    q.check_room(4)
    add(q, 1, 1, 1)
    q.check_room(1)
    with pytest.raises(OverloadedError, match=r"overloaded: 3 texts queued \(limit 4\); retry"):
        q.check_room(2)
    with pytest.raises(OverloadedError, match=r"5 texts can never fit model 'm''s queue of 4"):
        q.check_room(5)


def test_time_to_batch_waits_out_the_delay_unless_full_or_flushing() -> None:
    q = queue(max_queue_delay=0.010, max_batch_size=3, max_batch_tokens=20)
    assert q.time_to_batch(5.0) is None  # nothing queued
    add(q, 2, enqueued=1.0)
    add(q, 2, enqueued=1.004)
    assert q.time_to_batch(1.006) == pytest.approx(0.004)  # the oldest item's delay
    assert q.time_to_batch(1.006, flushing=True) == 0.0
    assert q.time_to_batch(1.020) == pytest.approx(-0.010)  # overdue
    add(q, 2, enqueued=1.005)
    assert q.time_to_batch(1.006) == 0.0  # full by items
    q.clear()
    add(q, 20, enqueued=1.0)
    assert q.time_to_batch(1.0) == 0.0  # full by tokens
    q.clear()
    add(q, 19, enqueued=1.0)
    assert q.time_to_batch(1.0) == pytest.approx(0.010)


def test_the_oldest_item_anchors_and_the_nearest_lengths_fill() -> None:
    q = queue(max_batch_size=3)
    late = add(q, 40, 41)
    early = add(q, 2)  # submitted later, so `late` anchors
    other = add(q, 30, 60)
    # bucket 4 (the anchor), then 3 before 5 (equally near: the shorter first)
    assert take(q) == [(late.seq, 40), (other.seq, 30), (late.seq, 41)]
    assert take(q) == [(early.seq, 2), (other.seq, 60)]


def test_at_equal_distance_the_shorter_bucket_goes_first() -> None:
    q = queue(max_batch_size=2)
    anchor = add(q, 20)  # bucket 2
    longer = add(q, 28)  # bucket 3
    shorter = add(q, 12)  # bucket 1
    assert take(q) == [(anchor.seq, 20), (shorter.seq, 12)]
    assert take(q) == [(longer.seq, 28)]


def test_the_token_budget_holds_to_the_last_token_and_a_long_item_runs_alone() -> None:
    q = queue(max_batch_tokens=12)
    fake = add(q, 4, 4, 4, 4)
    assert take(q) == [(fake.seq, 4)] * 3  # 3 x 4 = 12 fits exactly, a fourth does not
    long = add(q, 50)
    assert take(q) == [(fake.seq, 4)]
    assert take(q) == [(long.seq, 50)]  # over the budget on its own, still runs


def test_the_padding_cap_applies_only_from_min_fill_on() -> None:
    q = queue(max_padding_ratio=0.5, min_fill=2)
    short = add(q, 1, 1)
    long = add(q, 9)
    # 2 short items, then a 9-token one: 11 real of 27 padded (59% padding) > 50%: it waits
    assert take(q) == [(short.seq, 1), (short.seq, 1)]
    assert take(q) == [(long.seq, 9)]
    q = queue(max_padding_ratio=0.5, min_fill=3)
    short = add(q, 1, 1)
    long = add(q, 9)
    assert take(q) == [(short.seq, 1), (short.seq, 1), (long.seq, 9)]  # below min_fill


def test_the_padding_cap_holds_at_its_boundary() -> None:
    q = queue(max_padding_ratio=0.5, min_fill=1)
    fake = add(q, 2, 4)  # 6 real of 8 padded: 25% padding, within
    assert take(q) == [(fake.seq, 2), (fake.seq, 4)]
    fake = add(q, 1, 2)  # 3 real of 4 padded: 25%
    assert take(q) == [(fake.seq, 1), (fake.seq, 2)]
    fake = add(q, 1, 3)  # 4 real of 6: 33%
    assert take(q) == [(fake.seq, 1), (fake.seq, 3)]
    fake = add(q, 1, 1, 6)  # 8 real of 18: 56% > 50%: the 6-token item waits
    assert take(q) == [(fake.seq, 1), (fake.seq, 1)]
    assert take(q) == [(fake.seq, 6)]


def test_answered_and_expired_items_are_dropped_with_their_reason() -> None:
    q = queue()
    answered = add(q, 3, done=True)
    expired = add(q, 3, deadline=1.0)
    alive = add(q, 3, deadline=2.0)
    drops: list[tuple[int, bool]] = []
    batch = q.take(1.0, lambda request, why: drops.append((request.seq, why)))
    assert [item.request for item in batch] == [alive]
    assert drops == [(answered.seq, False), (expired.seq, True)]
    assert len(q) == 0 and q.tokens == 0


def test_a_dropped_item_does_not_hold_back_the_bucket_behind_it() -> None:
    q = queue(max_batch_size=2)
    add(q, 3, done=True)
    behind = add(q, 3, 3, 3)
    assert [item.request for item in q.take(0.0, lambda r, e: None)] == [behind, behind]
    assert len(q) == 1


def test_buckets_are_bucket_width_tokens_wide() -> None:
    assert BUCKET_WIDTH == 8
    q = queue(max_batch_size=2)
    anchor = add(q, 9)  # bucket 1 (9..16)
    far = add(q, 8)  # bucket 0: one bucket away
    near = add(q, 16)  # bucket 1: the anchor's own
    assert take(q) == [(anchor.seq, 9), (near.seq, 16)]
    assert take(q) == [(far.seq, 8)]


def test_the_queue_is_pure_no_asyncio_threads_or_futures() -> None:
    import ast
    from pathlib import Path

    import textserve.service.engine.queue as module

    tree = ast.parse(Path(module.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert not imported & {"asyncio", "threading", "concurrent", "time"}, imported
