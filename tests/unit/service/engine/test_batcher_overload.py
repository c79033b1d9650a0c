"""The dynamic batcher's admission: the queue takes exactly its limit, a request that does not
fit is refused at once with what to do, and a malformed call is refused with its reason (a
fake run_batch)."""

from __future__ import annotations

import asyncio

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
    NotReadyError,
    OverloadedError,
)

# -- the queue's bound: refused at once, saying whether to retry or send fewer -----------------


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


def test_the_queue_takes_exactly_its_limit_and_refusals_say_what_to_do() -> None:
    async def main() -> None:
        batcher: Batcher[int] = Batcher(FakeModel(), BatcherConfig(max_queue_size=4))  # no name
        batcher.start()
        batcher.pause()
        whole = asyncio.create_task(batcher.submit([1, 2, 3, 4], [1] * 4))  # n == limit: fits
        await wait_until(lambda: batcher.snapshot().queue_depth == 4)
        with pytest.raises(OverloadedError) as full:
            await batcher.submit([5], [1])
        assert str(full.value) == (
            "model 'model' is overloaded: 4 texts queued (limit 4); retry later"
        )
        with pytest.raises(OverloadedError) as never:
            await batcher.submit([1] * 5, [1] * 5)
        assert str(never.value) == (
            "5 texts can never fit model 'model''s queue of 4; send fewer texts per request"
        )
        batcher.resume()
        assert (await whole).outputs[:, 0].tolist() == [1, 2, 3, 4]
        batcher.pause()
        three = asyncio.create_task(batcher.submit([1, 2, 3], [1] * 3))
        await wait_until(lambda: batcher.snapshot().queue_depth == 3)
        with pytest.raises(OverloadedError, match="overloaded: 3 texts queued"):
            await batcher.submit([1] * 4, [1] * 4)  # could fit an empty queue: "retry later"
        last = asyncio.create_task(batcher.submit([4], [1]))  # 3 + 1 == limit: fits
        await wait_until(lambda: batcher.snapshot().queue_depth == 4)
        batcher.resume()
        await asyncio.gather(three, last)
        await batcher.close()

    asyncio.run(main())


def test_a_refusal_names_the_batchers_model_and_the_batcher_keeps_the_config_it_was_given() -> None:
    config = BatcherConfig(max_queue_size=1)

    async def main() -> None:
        batcher: Batcher[int] = Batcher(FakeModel(), config, name="sentiment")
        assert batcher.config is config  # ModelHandle.warmup reads max_batch_size there
        batcher.start()
        with pytest.raises(OverloadedError) as never:
            await batcher.submit([1, 2], [1, 1])
        assert str(never.value) == (
            "2 texts can never fit model 'sentiment''s queue of 1; send fewer texts per request"
        )
        await batcher.close()

    asyncio.run(main())


# -- calls refused for what they are -----------------------------------------------------------


def test_submit_refuses_bad_calls_with_their_reason() -> None:
    clock = FakeClock()

    async def main() -> None:
        batcher: Batcher[int] = Batcher(FakeModel(), BatcherConfig(), name="fake", clock=clock)
        batcher.start()
        with pytest.raises(ValueError, match=r"^submit needs one length per payload, got 0 and 0$"):
            await batcher.submit([], [])
        with pytest.raises(ValueError, match="got 2 and 1"):
            await batcher.submit([1, 2], [1])
        with pytest.raises(DeadlineExceededError) as late:
            await batcher.submit([1], [1], deadline=clock.now)  # due now: already passed
        assert str(late.value) == "the deadline had passed before the request was queued"
        await batcher.close()
        with pytest.raises(NotReadyError) as closed:
            await batcher.submit([1], [1])
        assert str(closed.value) == "model 'fake' is not accepting requests (shutting down)"

    asyncio.run(main())
