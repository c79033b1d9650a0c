"""The dynamic batcher's deadlines and cancellations: a deadline already passed is refused, an
item that expires or whose caller leaves is dropped before inference, counted, and holds
nothing back; under mixed traffic every caller gets its rows or its error (a fake run_batch)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.unit.service.engine.batcher_fakes import (
    FakeClock,
    FakeModel,
    run,
    wait_until,
)
from textserve.service.config import BatcherConfig
from textserve.service.engine.batcher import Batcher
from textserve.service.errors import (
    DeadlineExceededError,
    OverloadedError,
)

# -- a deadline passed before the request was queued -------------------------------------------


def test_deadline_already_passed_is_refused() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        with pytest.raises(DeadlineExceededError):
            await batcher.submit([1], [1], deadline=asyncio.get_running_loop().time() - 1)
        assert model.batches == []

    run(body)


# -- expiry in the queue and while a batch runs ------------------------------------------------


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


def test_items_whose_deadline_passed_in_the_queue_are_dropped_and_counted() -> None:
    clock = FakeClock()
    model = FakeModel()

    async def main() -> None:
        batcher: Batcher[int] = Batcher(model, BatcherConfig(), name="fake", clock=clock)
        batcher.start()
        batcher.pause()
        # deadlines on the batcher's clock: the loop's timers would fire only in 10 s
        doomed = [
            asyncio.create_task(batcher.submit([i], [3], deadline=clock.now + 10)) for i in (1, 2)
        ]
        live = asyncio.create_task(batcher.submit([3], [3]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 3)
        clock.now += 10  # exactly at the deadline: expired
        batcher.resume()
        for task in doomed:
            with pytest.raises(DeadlineExceededError) as info:
                await task
            assert str(info.value) == "deadline exceeded after 10.000s waiting for model 'fake'"
        assert (await live).outputs[:, 0].tolist() == [3]
        assert model.batches == [[3]]
        assert batcher.snapshot().dropped_deadline == 2
        await batcher.close()

    asyncio.run(main())


def test_an_item_expiring_while_a_batch_runs_is_dropped_by_the_inference_thread() -> None:
    clock = FakeClock()
    gate = threading.Event()
    model = FakeModel(gate)

    async def main() -> None:
        config = BatcherConfig(max_batch_size=1)
        batcher: Batcher[int] = Batcher(model, config, name="fake", clock=clock)
        batcher.start()
        running = asyncio.create_task(batcher.submit([1], [1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 0)  # taken: it runs
        doomed = asyncio.create_task(batcher.submit([2], [1], deadline=clock.now + 10))
        await wait_until(lambda: batcher.snapshot().queue_depth == 1)
        clock.now += 20
        gate.set()  # the thread finishes batch 1 and looks at the queue itself
        await running
        with pytest.raises(DeadlineExceededError):
            await asyncio.wait_for(doomed, 5)
        assert model.batches == [[1]] and batcher.snapshot().dropped_deadline == 1
        await batcher.close()

    asyncio.run(main())


def test_the_batcher_goes_on_after_a_batch_whose_every_item_expired() -> None:
    clock = FakeClock()

    async def main() -> None:
        batcher: Batcher[int] = Batcher(FakeModel(), BatcherConfig(), name="fake", clock=clock)
        batcher.start()
        batcher.pause()
        doomed = asyncio.create_task(batcher.submit([1], [1], deadline=clock.now + 1))
        await wait_until(lambda: batcher.snapshot().queue_depth == 1)
        clock.now += 2
        batcher.resume()
        with pytest.raises(DeadlineExceededError):
            await doomed
        result = await asyncio.wait_for(batcher.submit([2], [1]), 5)  # still served
        assert result.outputs[:, 0].tolist() == [2]
        await batcher.close()

    asyncio.run(main())


# -- callers that leave ------------------------------------------------------------------------


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


def test_an_item_dropped_from_a_bucket_does_not_hold_back_the_items_behind_it() -> None:
    clock = FakeClock()
    model = FakeModel()

    async def main() -> None:
        batcher: Batcher[int] = Batcher(model, BatcherConfig(), name="fake", clock=clock)
        batcher.start()
        for drop in ("cancelled", "expired"):
            model.batches.clear()
            batcher.pause()
            deadline = clock.now + 1 if drop == "expired" else None
            # the oldest item (dropped) heads the bucket of 1..8 tokens, 2 is behind it and 3
            # is in the bucket of 9..16
            gone = asyncio.create_task(batcher.submit([1], [3], deadline=deadline))
            await wait_until(lambda: batcher.snapshot().queue_depth == 1)
            rest = asyncio.create_task(batcher.submit([2, 3], [3, 12]))
            await wait_until(lambda: batcher.snapshot().queue_depth == 3)
            if drop == "cancelled":
                gone.cancel()
            else:
                clock.now += 1
            batcher.resume()
            assert (await rest).outputs[:, 0].tolist() == [2, 3]
            assert model.batches == [[2, 3]], drop  # one batch: 2 was not left for another
            with pytest.raises(
                asyncio.CancelledError if drop == "cancelled" else DeadlineExceededError
            ):
                await gone
        stats = batcher.snapshot()
        assert (stats.dropped_cancelled, stats.dropped_deadline) == (1, 1)
        await batcher.close()

    asyncio.run(main())


def test_submit_nowait_calls_back_with_each_result_error_or_cancellation() -> None:
    async def body(batcher: Batcher[int], model: FakeModel) -> None:
        answers: dict[str, Any] = {}

        def keep(key: str) -> Callable[[Any, BaseException | None], None]:
            return lambda result, exc: answers.__setitem__(key, (result, exc))

        batcher.pause()
        batcher.submit_nowait([1, 2], [3, 3], keep("a"))
        batcher.submit_nowait([3], [3], keep("expired"), deadline=time.monotonic() + 0.01)
        dropped = batcher.submit_nowait([4], [3], keep("cancelled"))
        dropped.cancel()
        await wait_until(lambda: {"expired", "cancelled"} <= set(answers))
        batcher.resume()
        await wait_until(lambda: "a" in answers)
        result, exc = answers["a"]
        assert exc is None and result.outputs[:, 0].tolist() == [1, 2]
        assert answers["expired"][0] is None
        assert isinstance(answers["expired"][1], DeadlineExceededError)
        assert isinstance(answers["cancelled"][1], asyncio.CancelledError)
        assert model.batches == [[1, 2]]  # the dropped and expired items never ran
        assert batcher._inflight == 0
        with pytest.raises(OverloadedError):  # refused at once, like submit()
            batcher.submit_nowait(list(range(9)), [1] * 9, keep("big"))
        assert "big" not in answers

    run(body, max_queue_size=8)


# -- mixed traffic: deadlines and cancellations on two inference threads -----------------------


def test_under_mixed_traffic_on_two_threads_each_caller_gets_its_rows_or_its_error() -> None:
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
        # a batch whose callers all left is counted when its results reach the loop, which can
        # be after the last caller returned: poll until the statistics caught up
        await wait_until(lambda: batcher.snapshot().batches >= len(sizes))
        snapshot = batcher.snapshot()
        assert len(outcomes) == 400 and outcomes.count("ok") >= 150
        assert snapshot.queue_depth == 0 and batcher._queue.tokens == 0
        # the statistics count exactly what the model ran
        assert (snapshot.batches, snapshot.items) == (len(sizes), sum(sizes))
        assert snapshot.max_batch_size_seen == max(sizes) <= 8
        assert sum(sizes) >= 150  # at least the rows of the answered calls
        await batcher.close()

    asyncio.run(main())
