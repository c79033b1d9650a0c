"""The dynamic batcher, what goes into a batch and when it goes: each caller's rows, the size
and token budgets, grouping by length under the padding cap, the oldest item first, the
delay, and the inference thread taking due batches itself (a fake run_batch)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from tests.unit.service.engine.batcher_fakes import (
    FakeClock,
    FakeModel,
    Recorder,
    run,
    wait_until,
)
from textserve.service.config import BatcherConfig
from textserve.service.engine.batcher import Batcher

# -- every caller gets its own rows, in one shared batch ---------------------------------------


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


# -- size and token budgets --------------------------------------------------------------------


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


def test_a_batch_fills_the_token_budget_exactly_and_min_fill_is_inclusive() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        batcher.pause()
        task = asyncio.create_task(batcher.submit(list(range(4)), [10] * 4))
        await wait_until(lambda: batcher.snapshot().queue_depth == 4)
        batcher.resume()
        await task
        assert [len(b) for b in model.batches] == [4]  # 4 x 10 == 40 tokens: one batch

    run(body, max_batch_size=8, max_batch_tokens=40)

    async def padded(batcher: Batcher[int], model: FakeModel) -> None:
        batcher.pause()
        # after two texts of 10 (min_fill reached) a 40 would make the batch 50% padding
        task = asyncio.create_task(batcher.submit([10, 10, 40], [10, 10, 40]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 3)
        batcher.resume()
        await task
        assert model.batches == [[10, 10], [40]]
        model.batches.clear()
        # 10, 10 then 16: exactly 25% padding (36 real of 48), not more: one batch
        await batcher.submit([10, 10, 16], [10, 10, 16])
        assert model.batches == [[10, 10, 16]]

    run(padded, max_padding_ratio=0.25, min_fill=2)


def test_an_item_longer_than_the_token_budget_still_runs_alone() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        result = await batcher.submit([7], [100])
        assert result.outputs[0, 0] == 7

    run(body, max_batch_tokens=10)


# -- grouping by length, under the padding cap -------------------------------------------------


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


def test_length_buckets_are_eight_tokens_wide() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        batcher.pause()
        # 9 (oldest) and 16 share the bucket 9..16; 8 is in the next one down
        task = asyncio.create_task(batcher.submit([9, 8, 16], [9, 8, 16]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 3)
        batcher.resume()
        await task
        assert model.batches == [[9, 16], [8]]

    run(body, max_batch_size=2)


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


def test_the_padding_cap_holds_to_the_last_token() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        batcher.pause()
        # 10 and 9 (min_fill reached), then 16: 35 real tokens of 48 is just over 25% padding
        task = asyncio.create_task(batcher.submit([10, 9, 16], [10, 9, 16]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 3)
        batcher.resume()
        await task
        assert model.batches == [[10, 9], [16]]

    run(body, max_padding_ratio=0.25, min_fill=2)


# -- order: the oldest item anchors the batch --------------------------------------------------


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


def test_the_oldest_item_anchors_the_batch_whichever_bucket_came_first() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        batcher.pause()
        # the bucket of 17..24 tokens is made first and still holds 3 after 1 has run; 2, in
        # the bucket made after it, is older than 3
        tasks = []
        for depth, (payload, length) in enumerate(((1, 20), (2, 3), (3, 20)), 1):
            tasks.append(asyncio.create_task(batcher.submit([payload], [length])))
            await wait_until(lambda depth=depth: batcher.snapshot().queue_depth == depth)
        batcher.resume()
        await asyncio.gather(*tasks)
        assert model.batches == [[1], [2], [3]]

    run(body, max_batch_size=1)


# -- when a batch goes: once full, or when its delay is up, and not while paused ---------------


def test_a_batch_waits_up_to_the_delay_to_fill_but_not_once_full() -> None:
    model = FakeModel()

    async def main() -> None:
        config = BatcherConfig(max_queue_delay=0.5, max_batch_size=3)
        batcher: Batcher[int] = Batcher(model, config, name="fake")
        batcher.start()
        first = asyncio.create_task(batcher.submit([1], [1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 1)
        await asyncio.sleep(0.01)  # well within the delay: the first item still waits
        await batcher.submit([2, 3], [1, 1])  # fills the batch: it goes at once
        await first
        assert model.batches == [[1, 2, 3]]
        await batcher.close()

    asyncio.run(main())


def test_a_full_batch_does_not_wait_out_the_delay() -> None:
    async def main() -> None:
        config = BatcherConfig(max_queue_delay=10.0, max_batch_size=2, max_batch_tokens=4)
        batcher: Batcher[int] = Batcher(FakeModel(), config, name="fake")
        batcher.start()
        await asyncio.wait_for(batcher.submit([1, 2], [1, 1]), 5)  # full by count
        await asyncio.wait_for(batcher.submit([3], [4]), 5)  # full by tokens
        await batcher.close()
        config = BatcherConfig(max_queue_delay=10.0, max_batch_size=8, max_batch_tokens=4)
        batcher = Batcher(FakeModel(), config, name="fake")
        batcher.start()
        await asyncio.wait_for(batcher.submit([1, 2], [2, 2]), 5)  # 2 + 2 tokens: full
        await batcher.close()

    asyncio.run(main())


def test_a_batch_short_of_full_goes_when_its_delay_is_up() -> None:
    async def main() -> None:
        config = BatcherConfig(max_queue_delay=0.02, max_batch_size=8)
        batcher: Batcher[int] = Batcher(FakeModel(), config, name="f")
        batcher.start()
        await asyncio.wait_for(batcher.submit([1], [1]), 5)  # woken by the delay's timer
        await batcher.close()

    asyncio.run(main())


def test_the_inference_thread_takes_no_batch_before_its_delay() -> None:
    clock = FakeClock()  # never moves: no delay passes
    gate = threading.Event()
    model = FakeModel(gate)

    async def main() -> None:
        config = BatcherConfig(max_queue_delay=0.5, max_batch_size=2)
        batcher: Batcher[int] = Batcher(model, config, name="fake", clock=clock)
        batcher.start()
        first = asyncio.create_task(batcher.submit([1, 1], [1, 1]))  # full: it runs at once
        await wait_until(lambda: batcher.snapshot().queue_depth == 0)
        second = asyncio.create_task(batcher.submit([2], [1]))  # short of full: it waits
        await wait_until(lambda: batcher.snapshot().queue_depth == 1)
        gate.set()
        await first
        assert batcher.snapshot().queue_depth == 1  # the thread left it to fill
        await batcher.submit([3], [1])
        await second
        assert model.batches == [[1, 1], [2, 3]]
        await batcher.close()

    try:
        asyncio.run(main())
    finally:
        gate.set()


def test_resume_does_not_cut_a_batch_delay_short() -> None:
    model = FakeModel()

    async def main() -> None:
        config = BatcherConfig(max_queue_delay=10.0, max_batch_size=3)
        batcher: Batcher[int] = Batcher(model, config, name="fake")
        batcher.start()
        batcher.pause()
        first = asyncio.create_task(batcher.submit([1], [1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 1)
        for _ in range(10):  # the loop turns: the worker sees the item and waits for resume()
            await asyncio.sleep(0)
        batcher.resume()
        for _ in range(10):  # ... then for the batch to fill or its delay to pass
            await asyncio.sleep(0)
        assert batcher.snapshot().queue_depth == 1
        await batcher.submit([2, 3], [1, 1])  # fills the batch
        await first
        assert model.batches == [[1, 2, 3]]
        await batcher.close()

    asyncio.run(main())


def test_a_paused_batcher_runs_no_next_batch_even_from_the_inference_thread() -> None:
    gate = threading.Event()
    model = FakeModel(gate)

    async def main() -> None:
        batcher: Batcher[int] = Batcher(model, BatcherConfig(max_batch_size=1), name="fake")
        batcher.start()
        first = asyncio.create_task(batcher.submit([1], [1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 0)
        second = asyncio.create_task(batcher.submit([2], [1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 1)
        batcher.pause()
        gate.set()
        await first
        for _ in range(20):  # the loop turns: nothing may take the second batch meanwhile
            await asyncio.sleep(0)
        assert model.batches == [[1]] and batcher.snapshot().queue_depth == 1
        batcher.resume()
        await second
        assert model.batches == [[1], [2]]
        await batcher.close()

    asyncio.run(main())


# -- the inference thread goes on to the next due batch without the loop -----------------------


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
