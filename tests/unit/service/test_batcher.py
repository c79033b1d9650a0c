"""Unit tests of the dynamic batcher with a fake run_batch: grouping, limits, deadlines, drain."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from textserve.service.config import BatcherConfig
from textserve.service.engine.batcher import Batcher, BatchStats
from textserve.service.errors import (
    DeadlineExceededError,
    InternalError,
    NotReadyError,
    OverloadedError,
)


class FakeModel:
    """run_batch: echoes each payload's value in column 0 and the batch's size in column 1."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.batches: list[list[int]] = []
        self.gate = gate

    def __call__(self, payloads: list[int]) -> np.ndarray:
        if self.gate is not None:
            self.gate.wait(5)
        self.batches.append(list(payloads))
        out = np.zeros((len(payloads), 2), dtype=np.float32)
        out[:, 0] = payloads
        out[:, 1] = len(payloads)
        return out


class Recorder:
    def __init__(self) -> None:
        self.batches: list[tuple[int, int, float]] = []
        self.waits: list[float] = []
        self.depths: list[int] = []
        self.inflight: list[int] = []

    def on_batch(self, size: int, padded_tokens: int, padding_ratio: float, seconds: float) -> None:
        self.batches.append((size, padded_tokens, padding_ratio))

    def on_queue_waits(self, waits: Any) -> None:
        self.waits.extend(waits)

    def on_queue_depth(self, depth: int) -> None:
        self.depths.append(depth)

    def on_inflight(self, texts: int) -> None:
        self.inflight.append(texts)


def run(
    body: Callable[[Batcher[int], FakeModel], Awaitable[Any]],
    model: FakeModel | None = None,
    observer: Recorder | None = None,
    **config: Any,
) -> Any:
    model = model or FakeModel()

    async def main() -> Any:
        batcher: Batcher[int] = Batcher(
            model, BatcherConfig(**config), observer=observer, name="fake"
        )
        batcher.start()
        try:
            return await body(batcher, model)
        finally:
            await batcher.close()

    return asyncio.run(main())


async def wait_until(predicate: Callable[[], bool]) -> None:
    for _ in range(10_000):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never became true")


def test_results_come_back_to_each_caller_in_order() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        results = await asyncio.gather(
            batcher.submit([1, 2, 3], [5, 5, 5]), batcher.submit([4], [5])
        )
        assert results[0].outputs[:, 0].tolist() == [1, 2, 3]
        assert results[1].outputs[:, 0].tolist() == [4]
        assert sum(len(b) for b in model.batches) == 4

    run(body)


def test_concurrent_requests_share_a_batch() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        batcher.pause()
        tasks = [asyncio.create_task(batcher.submit([i], [4])) for i in range(10)]
        await wait_until(lambda: batcher.snapshot().queue_depth == 10)
        batcher.resume()
        results = await asyncio.gather(*tasks)
        assert model.batches == [list(range(10))]
        assert all(r.outputs[0, 1] == 10 for r in results)
        assert batcher.snapshot().max_batch_size_seen == 10

    run(body, max_queue_delay=1.0, max_batch_size=10)


def test_batches_respect_max_batch_size_and_tokens() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        batcher.pause()
        task = asyncio.create_task(batcher.submit(list(range(10)), [10] * 10))
        await wait_until(lambda: batcher.snapshot().queue_depth == 10)
        batcher.resume()
        await task
        # 4 items x 10 tokens = 40 > 35 tokens: at most 3 per batch
        assert [len(b) for b in model.batches] == [3, 3, 3, 1]

    run(body, max_batch_size=4, max_batch_tokens=35)


def test_an_item_longer_than_the_token_budget_still_runs_alone() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        result = await batcher.submit([7], [100])
        assert result.outputs[0, 0] == 7

    run(body, max_batch_tokens=10)


def test_items_of_similar_length_are_grouped() -> None:
    recorder = Recorder()

    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        batcher.pause()
        # payload == length; alternate short and long texts
        lengths = [4, 60, 5, 61, 6, 62, 7, 63]
        task = asyncio.create_task(batcher.submit(lengths, lengths))
        await wait_until(lambda: batcher.snapshot().queue_depth == 8)
        batcher.resume()
        await task
        assert [sorted(b) for b in model.batches] == [[4, 5, 6, 7], [60, 61, 62, 63]]
        ratios = [ratio for _, _, ratio in recorder.batches]
        assert max(ratios) < 0.5

    run(body, observer=recorder, max_batch_size=4)


def test_padding_cap_splits_full_batches_but_not_small_ones() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        batcher.pause()
        lengths = [10] * 8 + [40] * 8 + [12, 41]  # 18 items, two length groups
        task = asyncio.create_task(batcher.submit(lengths, lengths))
        await wait_until(lambda: batcher.snapshot().queue_depth == len(lengths))
        batcher.resume()
        await task
        assert [sorted(b) for b in model.batches] == [[10] * 8 + [12], [40] * 8 + [41]]
        model.batches.clear()
        await batcher.submit([5, 40, 6], [5, 40, 6])  # fewer than min_fill: one batch
        assert len(model.batches) == 1

    run(body, max_padding_ratio=0.25, min_fill=8)


def test_oldest_item_anchors_the_batch_so_long_items_do_not_starve() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        batcher.pause()
        long = asyncio.create_task(batcher.submit([100], [100]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 1)
        shorts = [asyncio.create_task(batcher.submit([i], [3])) for i in range(4)]
        await wait_until(lambda: batcher.snapshot().queue_depth == 5)
        batcher.resume()
        await asyncio.gather(long, *shorts)
        assert 100 in model.batches[0]

    run(body, max_batch_size=2)


def test_full_queue_refuses_at_once() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        batcher.pause()
        first = asyncio.create_task(batcher.submit([1, 2, 3], [1, 1, 1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 3)
        with pytest.raises(OverloadedError, match="overloaded: 3 texts queued"):
            await batcher.submit([4, 5], [1, 1])
        with pytest.raises(OverloadedError, match="can never fit"):
            await batcher.submit([1] * 5, [1] * 5)
        batcher.resume()
        await first
        assert batcher.snapshot().rejected_overloaded == 2

    run(body, max_queue_size=4)


def test_expired_deadline_is_dropped_before_inference() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        batcher.pause()
        loop = asyncio.get_running_loop()
        expiring = asyncio.create_task(batcher.submit([1, 2], [3, 3], deadline=loop.time() + 0.02))
        keeper = asyncio.create_task(batcher.submit([3], [3]))
        with pytest.raises(DeadlineExceededError, match="deadline exceeded"):
            await expiring
        batcher.resume()
        await keeper
        assert model.batches == [[3]]
        assert batcher.snapshot().dropped_deadline == 2

    run(body)


def test_deadline_already_passed_is_refused() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        with pytest.raises(DeadlineExceededError):
            await batcher.submit([1], [1], deadline=asyncio.get_running_loop().time() - 1)
        assert model.batches == []

    run(body)


def test_cancelled_caller_is_dropped_before_inference() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        batcher.pause()
        gone = asyncio.create_task(batcher.submit([1, 2], [3, 3]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 2)
        gone.cancel()
        stays = asyncio.create_task(batcher.submit([3], [3]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 3)
        batcher.resume()
        await stays
        assert model.batches == [[3]]
        assert batcher.snapshot().dropped_cancelled == 2

    run(body)


def test_inference_error_fails_the_batch_and_the_batcher_goes_on() -> None:
    calls = []

    def flaky(payloads: list[int]) -> np.ndarray:
        calls.append(payloads)
        if len(calls) == 1:
            raise ValueError("boom")
        return np.ones((len(payloads), 1))

    async def main() -> None:
        batcher: Batcher[int] = Batcher(flaky, BatcherConfig())
        batcher.start()
        with pytest.raises(InternalError, match="inference failed"):
            await batcher.submit([1], [1])
        assert (await batcher.submit([2], [1])).outputs.shape == (1, 1)
        await batcher.close()

    asyncio.run(main())


def test_observer_sees_batches_waits_and_depth() -> None:
    recorder = Recorder()

    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        await batcher.submit([1, 2], [2, 4])

    run(body, observer=recorder)
    assert recorder.batches == [(2, 8, 0.25)]
    assert len(recorder.waits) == 2
    assert recorder.depths[0] == 2 and recorder.depths[-1] == 0


def test_inflight_counts_queued_and_running_texts_until_answered() -> None:
    """textserve_inflight_texts (the autoscaling signal) counts a text from its submit until its
    answer, also while its batch runs (when the queue depth is already back to 0)."""
    recorder = Recorder()
    gate = threading.Event()

    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        first = asyncio.create_task(batcher.submit([1, 2, 3], [1, 1, 1]))
        await wait_until(lambda: bool(recorder.inflight) and recorder.inflight[-1] == 3)
        second = asyncio.create_task(batcher.submit([4], [1]))
        await wait_until(lambda: recorder.inflight[-1] == 4)
        assert batcher.snapshot().queue_depth < 4  # the first batch left the queue: it runs
        gate.set()
        await asyncio.gather(first, second)

    run(body, model=FakeModel(gate), observer=recorder)
    assert max(recorder.inflight) == 4 and recorder.inflight[-1] == 0


def test_close_drains_queued_work_then_refuses() -> None:
    async def main() -> None:
        model = FakeModel()
        batcher: Batcher[int] = Batcher(model, BatcherConfig(max_queue_delay=5.0))
        batcher.start()
        pending = asyncio.create_task(batcher.submit([1, 2], [1, 1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 2)
        await batcher.close(timeout=None)  # flushes rather than waiting the 5 s delay
        assert (await pending).outputs[:, 0].tolist() == [1, 2]
        with pytest.raises(NotReadyError):
            await batcher.submit([3], [1])

    asyncio.run(main())


def test_close_without_grace_fails_what_is_left() -> None:
    gate = threading.Event()

    async def main() -> None:
        model = FakeModel(gate)
        batcher: Batcher[int] = Batcher(model, BatcherConfig(max_batch_size=1))
        batcher.start()
        running = asyncio.create_task(batcher.submit([1], [1]))
        queued = asyncio.create_task(batcher.submit([2], [1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 1)  # 1 runs, 2 waits
        await batcher.close(timeout=0)
        gate.set()
        with pytest.raises(NotReadyError, match="stopped during inference"):
            await running
        with pytest.raises(NotReadyError, match="shut down"):
            await queued

    asyncio.run(main())


def test_timings_report_queue_and_inference() -> None:
    """queue_seconds covers the time held in the queue, inference_seconds the model's run, and
    together they fit in the call: bounds from the test's own clock readings around them."""

    def model(payloads: list[int]) -> np.ndarray:
        time.sleep(0.02)  # the inference: at least 20 ms
        return np.ones((len(payloads), 1))

    async def main() -> None:
        batcher: Batcher[int] = Batcher(model, BatcherConfig())
        batcher.start()
        batcher.pause()
        called = time.monotonic()
        task = asyncio.create_task(batcher.submit([1], [1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 1)
        queued = time.monotonic()  # the item was enqueued before this
        await asyncio.sleep(0.05)  # a wait in the queue to measure, not a synchronisation
        resumed = time.monotonic()  # the batch starts after this
        batcher.resume()
        result = await task
        total = time.monotonic() - called
        await batcher.close()
        assert result.queue_seconds >= resumed - queued
        assert result.inference_seconds >= 0.02
        assert result.queue_seconds + result.inference_seconds <= total

    asyncio.run(main())


def test_stats_mean_batch_size() -> None:
    stats = BatchStats(batches=4, items=10)
    assert stats.mean_batch_size == 2.5
    assert BatchStats().mean_batch_size == 0.0


def test_the_inference_thread_goes_on_to_the_next_batch_without_the_loop() -> None:
    # The loop is busy (here: blocked) when a batch finishes; the executor thread takes the
    # next due batch itself instead of idling until the loop comes back to hand it one.
    started: list[int] = []

    def model(payloads: list[int]) -> np.ndarray:
        started.extend(payloads)
        time.sleep(0.02)
        return np.ones((len(payloads), 1))

    async def main() -> None:
        batcher: Batcher[int] = Batcher(model, BatcherConfig(max_batch_size=1))
        batcher.start()
        calls = [asyncio.create_task(batcher.submit([i], [1])) for i in range(3)]
        await wait_until(lambda: bool(started))
        # The loop is blocked (it polls without yielding) until the executor thread has
        # started all three batches by itself, or 10 s have passed.
        blocked_until = time.monotonic() + 10
        while len(started) < 3 and time.monotonic() < blocked_until:
            time.sleep(0.001)
        assert started == [0, 1, 2]  # all three ran meanwhile, back to back
        results = await asyncio.gather(*calls)
        assert [r.outputs.shape for r in results] == [(1, 1)] * 3
        assert batcher.stats.batches == 3
        await batcher.close()

    asyncio.run(main())


def test_many_callers_two_inference_threads_deadlines_and_cancellations() -> None:
    # The queue is shared by the loop and the executor threads (which take batches themselves):
    # under mixed traffic every caller gets its own rows or its own error, and nothing is lost.
    rng = random.Random(0)

    sizes: list[int] = []  # every batch the model ran

    def model(payloads: list[int]) -> np.ndarray:
        sizes.append(len(payloads))
        time.sleep(rng.random() * 0.002)
        return np.asarray(payloads, dtype=np.float64).reshape(-1, 1)

    async def main() -> None:
        config = BatcherConfig(max_batch_size=8, max_batch_tokens=64, max_queue_size=10_000)
        batcher: Batcher[int] = Batcher(model, config, workers=2, name="stress")
        batcher.start()
        loop = asyncio.get_running_loop()
        outcomes: list[str] = []

        async def caller(c: int) -> None:
            for r in range(8):
                n = rng.randint(1, 4)
                payloads = [c * 1000 + r * 10 + i for i in range(n)]
                lengths = [rng.randint(1, 16) for _ in range(n)]
                kind = rng.choice(["plain", "plain", "deadline", "cancel"])
                deadline = loop.time() + rng.random() * 0.01 if kind == "deadline" else None
                task = asyncio.ensure_future(batcher.submit(payloads, lengths, deadline=deadline))
                if kind == "cancel":
                    await asyncio.sleep(rng.random() * 0.003)
                    task.cancel()
                try:
                    result = await task
                except DeadlineExceededError:
                    assert kind == "deadline"
                    outcomes.append("expired")
                except asyncio.CancelledError:
                    assert kind == "cancel"
                    outcomes.append("cancelled")
                else:
                    assert result.outputs[:, 0].tolist() == payloads  # its own rows, in order
                    outcomes.append("ok")

        await asyncio.gather(*(caller(c) for c in range(50)))
        snapshot = batcher.snapshot()
        assert len(outcomes) == 400 and outcomes.count("ok") >= 150
        assert snapshot.queue_depth == 0 and batcher._queued_tokens == 0
        # the statistics count exactly what the model ran
        assert (snapshot.batches, snapshot.items) == (len(sizes), sum(sizes))
        assert snapshot.max_batch_size_seen == max(sizes) <= 8
        assert sum(sizes) >= 150  # at least the rows of the answered calls
        await batcher.close()

    asyncio.run(main())
