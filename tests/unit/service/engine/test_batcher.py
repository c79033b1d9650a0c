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
from textserve.service.engine.batcher import Batcher, BatchOutput, BatchStats, RunStats
from textserve.service.errors import (
    DeadlineExceededError,
    InternalError,
    NotReadyError,
    OverloadedError,
    ValidationError,
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

    def on_expected_wait(self, seconds: float) -> None:
        pass

    def on_refused(self, reason: str) -> None:
        pass

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
        task = asyncio.create_task(batcher.submit([1, 2], [1, 1]))  # two items, one batch
        await wait_until(lambda: batcher.snapshot().queue_depth == 2)
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


def test_while_flushing_the_inference_thread_also_goes_on_to_a_batch_that_is_not_full() -> None:
    # The drain phase (flush(), as close() does) runs what is queued at once, however long the
    # delay: the executor thread takes such a batch itself too, not only full ones.
    started: list[int] = []
    flushed = threading.Event()

    def model(payloads: list[int]) -> np.ndarray:
        started.extend(payloads)
        flushed.wait(5)  # each batch ends only once the batcher is flushing
        return np.ones((len(payloads), 1))

    async def main() -> None:
        config = BatcherConfig(max_batch_size=4, max_batch_tokens=10, max_queue_delay=5)
        batcher: Batcher[int] = Batcher(model, config)
        batcher.start()
        # 8 tokens each, 10 per batch: one item a batch; full by tokens while two wait
        calls = [asyncio.create_task(batcher.submit([i], [8])) for i in range(3)]
        await wait_until(lambda: bool(started))
        batcher.flush()
        flushed.set()
        # The loop is blocked until the executor thread has started all three batches by
        # itself, or 1 s has passed: the last one, alone, fills no batch and its delay is 5 s.
        blocked_until = time.monotonic() + 1
        while len(started) < 3 and time.monotonic() < blocked_until:
            time.sleep(0.001)
        assert started == [0, 1, 2]
        await asyncio.gather(*calls)
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


# -- contracts `make mutate` found unchecked -------------------------------------------------


class FullRecorder(Recorder):
    """Also records each batch's seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []

    def on_batch(self, size: int, padded_tokens: int, padding_ratio: float, seconds: float) -> None:
        super().on_batch(size, padded_tokens, padding_ratio, seconds)
        self.seconds.append(seconds)


class FakeClock:
    """The batcher's clock, moved by hand: deadlines expire when the test says."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


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


def test_close_without_grace_cancels_the_queue_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        batcher: Batcher[int] = Batcher(FakeModel(), BatcherConfig(), name="fake")
        batcher.start()
        batcher.pause()
        tasks = [asyncio.create_task(batcher.submit([i], [1])) for i in (1, 2)]
        await wait_until(lambda: batcher.snapshot().queue_depth == 2)
        await batcher.close()  # the default: no grace
        for task in tasks:
            with pytest.raises(NotReadyError, match="model 'fake' shut down before this request"):
                await task
        assert batcher.snapshot().queue_depth == 0 and batcher._queue.tokens == 0

    asyncio.run(main())
    assert [r.getMessage() for r in caplog.records] == [
        "fake: cancelled 2 queued texts at shutdown"
    ]


def test_close_with_a_grace_stops_waiting_at_its_end(caplog: pytest.LogCaptureFixture) -> None:
    gate = threading.Event()
    hold = 5.0  # the model holds its batch this long, far longer than the grace

    def model(payloads: list[int]) -> np.ndarray:
        gate.wait(hold)
        return np.ones((len(payloads), 1))

    async def main() -> float:
        batcher: Batcher[int] = Batcher(model, BatcherConfig(max_batch_size=1), name="fake")
        batcher.start()
        running = asyncio.create_task(batcher.submit([1], [1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 0)
        queued = asyncio.create_task(batcher.submit([2], [1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 1)
        started = time.monotonic()
        await batcher.close(0.05)  # returns at the end of the grace, the batch still running
        took = time.monotonic() - started
        gate.set()
        for task in (running, queued):
            with pytest.raises(NotReadyError):
                await task
        return took

    took = asyncio.run(main())
    assert took < hold / 2  # it neither waited for the batch nor for its executor thread
    messages = [r.getMessage() for r in caplog.records]
    assert "fake: 1 queued texts left after the grace period" in messages


def test_a_wrong_row_count_or_a_failing_model_fails_the_batch_with_the_reason_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def short(payloads: list[int]) -> np.ndarray:
        return np.ones((len(payloads) - 1, 1))

    def broken(payloads: list[int]) -> np.ndarray:
        raise RuntimeError("boom")

    for model, reason in ((short, "RuntimeError"), (broken, "RuntimeError")):
        caplog.clear()

        async def main(
            model: Callable[[list[int]], np.ndarray] = model, reason: str = reason
        ) -> None:
            batcher: Batcher[int] = Batcher(model, BatcherConfig(), name="fake")
            batcher.start()
            with pytest.raises(InternalError) as info:
                await batcher.submit([1, 2], [1, 1])
            assert str(info.value) == f"inference failed ({reason})"
            await batcher.close()

        asyncio.run(main())
        (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
        assert record.getMessage() == "fake: inference failed for a batch of 2"
        assert record.exc_info is not None and record.exc_info[0] is RuntimeError
        expected = "run_batch returned 1 rows for 2 items" if model is short else "boom"
        assert str(record.exc_info[1]) == expected


def test_batch_output_runs_and_row_errors_reach_their_callers_and_the_statistics() -> None:
    recorder = FullRecorder()

    def model(payloads: list[int]) -> BatchOutput:
        outputs = np.asarray(payloads, dtype=np.float32).reshape(-1, 1)
        runs = (RunStats(0, 0, 0, 0.5), RunStats(2, 8, 5, 0.25), RunStats(1, 0, 0, 0.125))
        return BatchOutput(outputs, runs, {0: ValidationError("row 0 is bad")})

    async def main() -> None:
        batcher: Batcher[int] = Batcher(model, BatcherConfig(), observer=recorder, name="f")
        batcher.start()
        batcher.pause()
        bad = asyncio.create_task(batcher.submit([7], [1]))
        good = asyncio.create_task(batcher.submit([8, 9], [1, 1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 3)
        batcher.resume()
        with pytest.raises(ValidationError, match="row 0 is bad"):
            await bad
        result = await good
        assert result.outputs[:, 0].tolist() == [8, 9]
        assert result.outputs.dtype == np.float32
        stats = batcher.snapshot()
        # the empty run is skipped, the others counted as they are
        assert (stats.batches, stats.items, stats.padded_tokens, stats.padding_tokens) == (
            2,
            3,
            8,
            3,
        )
        await batcher.close()

    asyncio.run(main())
    assert recorder.batches == [(2, 8, pytest.approx(3 / 8)), (1, 0, 0.0)]
    assert recorder.seconds == [0.25, 0.125]


def test_a_request_split_over_batches_sums_their_time_and_its_rows_keep_their_dtype() -> None:
    recorder = FullRecorder()

    def model(payloads: list[int]) -> np.ndarray:
        time.sleep(0.02)
        names.add(threading.current_thread().name)
        return np.asarray(payloads, dtype=np.float32).reshape(-1, 1)

    names: set[str] = set()

    async def main() -> None:
        batcher: Batcher[int] = Batcher(
            model, BatcherConfig(max_batch_size=2), observer=recorder, name="split"
        )
        batcher.start()
        batcher.pause()
        started = time.monotonic()
        task = asyncio.create_task(batcher.submit([1, 2, 3, 4], [1] * 4))
        await wait_until(lambda: batcher.snapshot().queue_depth == 4)
        batcher.resume()
        result = await task
        total = time.monotonic() - started
        assert result.outputs[:, 0].tolist() == [1, 2, 3, 4]
        assert result.outputs.dtype == np.float32
        assert result.inference_seconds >= 0.04  # both batches, 20 ms each at least
        assert len(recorder.seconds) == 2 and all(s >= 0.02 for s in recorder.seconds)
        assert all(0 <= w <= total for w in recorder.waits)
        assert all(isinstance(d, int) for d in recorder.depths) and recorder.depths[-1] == 0
        await batcher.close()

    asyncio.run(main())
    assert names and all(name.startswith("infer-split") for name in names)


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


def test_an_executor_passed_in_is_left_running_and_an_own_one_is_shut_down() -> None:
    from concurrent.futures import ThreadPoolExecutor

    shared = ThreadPoolExecutor(1)

    async def main() -> None:
        lent: Batcher[int] = Batcher(FakeModel(), BatcherConfig(), executor=shared)
        own: Batcher[int] = Batcher(FakeModel(), BatcherConfig())
        for batcher in (lent, own):
            batcher.start()
            await batcher.submit([1], [1])
            await batcher.close()
        assert own._executor._shutdown  # type: ignore[attr-defined]

    asyncio.run(main())
    assert shared.submit(lambda: 42).result(timeout=5) == 42  # still usable
    shared.shutdown()


def test_flush_runs_what_is_queued_without_waiting_for_the_delay() -> None:
    async def main() -> None:
        config = BatcherConfig(max_queue_delay=10.0, max_batch_size=8)
        batcher: Batcher[int] = Batcher(FakeModel(), config, name="fake")
        batcher.start()
        task = asyncio.create_task(batcher.submit([1], [1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 1)
        batcher.flush()  # the drain: no more traffic is coming
        await asyncio.wait_for(task, 5)
        await batcher.close()

    asyncio.run(main())


def test_the_worker_goes_on_after_a_take_that_dropped_everything() -> None:
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


def test_close_with_a_grace_lets_queued_work_finish() -> None:
    async def main() -> None:
        batcher: Batcher[int] = Batcher(FakeModel(), BatcherConfig(max_batch_size=1), name="f")
        batcher.start()
        batcher.pause()
        tasks = [asyncio.create_task(batcher.submit([i], [1])) for i in (1, 2, 3)]
        await wait_until(lambda: batcher.snapshot().queue_depth == 3)
        await batcher.close(30)  # returns once idle, long before the grace
        assert [(await t).outputs[0, 0] for t in tasks] == [1, 2, 3]

    asyncio.run(main())


def test_a_batch_short_of_full_goes_when_its_delay_is_up() -> None:
    async def main() -> None:
        config = BatcherConfig(max_queue_delay=0.02, max_batch_size=8)
        batcher: Batcher[int] = Batcher(FakeModel(), config, name="f")
        batcher.start()
        await asyncio.wait_for(batcher.submit([1], [1]), 5)  # woken by the delay's timer
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


# -- behaviour the batcher's surviving mutants changed -------------------------------------


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


def test_close_leaves_no_queued_item_to_a_chain_nobody_will_answer() -> None:
    """A batch that finishes while close() stops the workers takes no further batch: what is
    still queued is failed by close(), not run by a thread whose results nobody delivers."""
    from concurrent.futures import ThreadPoolExecutor

    gate = threading.Event()
    model = FakeModel(gate)
    pool = ThreadPoolExecutor(1)
    answers: list[BaseException | None] = []

    def stopped(result: Any, exc: BaseException | None) -> None:
        # on the loop while close() cancels the workers: batch 1 finishes now, and the loop
        # waits here until the inference thread is done with it (the pool's one thread)
        answers.append(exc)
        gate.set()
        pool.submit(lambda: None).result(timeout=5)

    async def main() -> None:
        config = BatcherConfig(max_batch_size=1)
        batcher: Batcher[int] = Batcher(model, config, executor=pool, name="fake")
        batcher.start()
        batcher.submit_nowait([1], [1], stopped)
        await wait_until(lambda: batcher.snapshot().queue_depth == 0)  # 1 runs
        queued = asyncio.create_task(batcher.submit([2], [1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 1)
        await batcher.close()
        assert model.batches == [[1]]
        assert isinstance(answers[0], NotReadyError) and "during inference" in str(answers[0])
        with pytest.raises(NotReadyError, match="shut down before this request ran"):
            await queued

    try:
        asyncio.run(main())
    finally:
        gate.set()
        pool.shutdown()


def test_close_during_a_chained_batch_fails_that_batch_and_answered_the_one_before() -> None:
    gates = {1: threading.Event(), 2: threading.Event()}
    entered: list[int] = []

    def model(payloads: list[int]) -> np.ndarray:
        entered.append(payloads[0])
        gates[payloads[0]].wait(5)
        return np.asarray(payloads, dtype=np.float32).reshape(-1, 1)

    async def main() -> None:
        batcher: Batcher[int] = Batcher(model, BatcherConfig(max_batch_size=1), name="fake")
        batcher.start()
        first = asyncio.create_task(batcher.submit([1], [1]))
        await wait_until(lambda: entered == [1])
        second = asyncio.create_task(batcher.submit([2], [1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 1)
        gates[1].set()
        await wait_until(lambda: entered == [1, 2])  # the thread went on to batch 2 itself
        assert (await first).outputs[:, 0].tolist() == [1]
        await batcher.close()
        with pytest.raises(NotReadyError, match="stopped during inference"):
            await second

    try:
        asyncio.run(main())
    finally:
        gates[2].set()


def test_a_failed_batch_reports_its_own_error_when_the_thread_goes_on_to_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = threading.Event()
    calls: list[list[int]] = []

    def model(payloads: list[int]) -> np.ndarray:
        calls.append(payloads)
        if len(calls) == 1:
            gate.wait(5)
            raise ValueError("boom")
        return np.ones((len(payloads), 1))

    async def main() -> None:
        batcher: Batcher[int] = Batcher(model, BatcherConfig(max_batch_size=1), name="fake")
        batcher.start()
        failing = asyncio.create_task(batcher.submit([1], [1]))
        await wait_until(lambda: calls == [[1]])
        queued = asyncio.create_task(batcher.submit([2], [1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 1)
        gate.set()  # batch 1 fails while 2 is due: the thread posts the failure and runs 2
        with pytest.raises(InternalError) as info:
            await failing
        assert str(info.value) == "inference failed (ValueError)"
        assert (await queued).outputs.shape == (1, 1)
        assert calls == [[1], [2]]
        await batcher.close()

    asyncio.run(main())
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.exc_info is not None and str(record.exc_info[1]) == "boom"


def test_a_run_batch_that_returns_nothing_fails_its_batch_and_the_batcher_goes_on() -> None:
    def model(payloads: list[int]) -> np.ndarray | None:
        return None if payloads == [1] else np.ones((len(payloads), 1))

    async def main() -> None:
        batcher: Batcher[int] = Batcher(model, BatcherConfig(), name="fake")  # type: ignore[arg-type]
        batcher.start()
        with pytest.raises(InternalError, match="inference failed"):
            await asyncio.wait_for(batcher.submit([1], [1]), 5)
        assert (await asyncio.wait_for(batcher.submit([2], [1]), 5)).outputs.shape == (1, 1)
        await batcher.close()

    asyncio.run(main())


def test_close_with_a_grace_waits_for_the_batch_of_every_worker() -> None:
    gates = {1: threading.Event(), 2: threading.Event()}
    entered: list[int] = []

    def model(payloads: list[int]) -> np.ndarray:
        entered.append(payloads[0])
        gates[payloads[0]].wait(5)
        return np.asarray(payloads, dtype=np.float32).reshape(-1, 1)

    async def main() -> None:
        config = BatcherConfig(max_batch_size=1)
        batcher: Batcher[int] = Batcher(model, config, workers=2, name="fake")
        batcher.start()
        first = asyncio.create_task(batcher.submit([1], [1]))
        second = asyncio.create_task(batcher.submit([2], [1]))
        await wait_until(lambda: sorted(entered) == [1, 2])  # a batch on each worker
        closing = asyncio.create_task(batcher.close(30))
        gates[1].set()
        assert (await first).outputs[:, 0].tolist() == [1]
        for _ in range(20):  # the loop turns: close() must go on waiting for batch 2
            await asyncio.sleep(0)
        assert not closing.done()
        gates[2].set()
        assert (await second).outputs[:, 0].tolist() == [2]
        await closing

    try:
        asyncio.run(main())
    finally:
        for gate in gates.values():
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


# -- tracing: what the trace of a traced request is told of its batches ----------------------


class RecordingTrace:
    """A request's BatchTrace: records each batch reported to it (or fails, when told to)."""

    def __init__(self, name: str, calls: list[tuple[Any, ...]], fail: bool = False) -> None:
        self.name = name
        self.calls = calls
        self.fail = fail

    def on_batch(
        self,
        traces: Any,
        started_ago: float,
        seconds: float,
        runs: Any,
        attributes: Any,
    ) -> None:
        if self.fail:
            raise RuntimeError("tracing broke")
        names = [t.name for t in traces]
        self.calls.append((self.name, names, started_ago, seconds, list(runs), dict(attributes)))


class TimedModel(FakeModel):
    """A FakeModel whose every batch takes 0.25 s on the batcher's (fake) clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def __call__(self, payloads: list[int]) -> np.ndarray:
        self.clock.now += 0.25
        return super().__call__(payloads)


def test_a_batch_is_reported_once_to_its_first_traced_request_with_every_traced_one() -> None:
    clock = FakeClock()
    model = TimedModel(clock)
    calls: list[tuple[Any, ...]] = []
    a, c = RecordingTrace("a", calls), RecordingTrace("c", calls)

    async def main() -> None:
        attributes = {"textserve.model": "m", "textserve.model.version": 3}
        batcher: Batcher[int] = Batcher(
            model, BatcherConfig(), name="fake", clock=clock, trace_attributes=attributes
        )
        batcher.start()
        batcher.pause()
        answers: list[Any] = []
        traced = asyncio.create_task(batcher.submit([1, 2], [1, 2], trace=a))
        untraced = asyncio.create_task(batcher.submit([3], [1]))
        await wait_until(lambda: batcher.snapshot().queue_depth == 3)
        batcher.submit_nowait([4], [3], lambda r, e: answers.append((r, e)), trace=c)
        clock.now += 0.5  # the batch starts half a second after the items queued
        batcher.resume()
        await asyncio.wait_for(asyncio.gather(traced, untraced), 5)
        await wait_until(lambda: len(answers) == 1)
        assert model.batches == [[1, 2, 3, 4]]
        assert calls == [
            # to a, the first traced request of the batch, once, with a and c (each once, the
            # untraced request left out); started 0.25 s before it was reported, 0.25 s long
            ("a", ["a", "c"], 0.25, 0.25, [RunStats(4, 4 * 3, 1 + 2 + 1 + 3, 0.25)], attributes)
        ]
        calls.clear()
        await asyncio.wait_for(batcher.submit([5], [2]), 5)  # a batch with no traced request
        assert calls == []
        await asyncio.wait_for(batcher.submit([6], [2], trace=c), 5)  # c alone
        assert calls == [("c", ["c"], 0.25, 0.25, [RunStats(1, 2, 2, 0.25)], attributes)]
        await batcher.close()

    asyncio.run(main())


def test_a_batch_span_says_nothing_of_the_model_when_the_batcher_was_given_nothing() -> None:
    calls: list[tuple[Any, ...]] = []

    async def main() -> None:
        batcher: Batcher[int] = Batcher(FakeModel(), BatcherConfig(), name="fake")
        batcher.start()
        await asyncio.wait_for(batcher.submit([1], [1], trace=RecordingTrace("a", calls)), 5)
        await batcher.close()

    asyncio.run(main())
    assert [call[-1] for call in calls] == [{}]


def test_a_trace_that_fails_is_logged_and_its_batch_still_answered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[tuple[Any, ...]] = []
    broken = RecordingTrace("a", calls, fail=True)

    async def main() -> None:
        batcher: Batcher[int] = Batcher(FakeModel(), BatcherConfig(), name="fake")
        batcher.start()
        result = await asyncio.wait_for(batcher.submit([1, 2], [1, 1], trace=broken), 5)
        assert result.outputs[:, 0].tolist() == [1, 2]
        result = await asyncio.wait_for(batcher.submit([3], [1]), 5)  # untraced: no log line
        assert result.outputs[:, 0].tolist() == [3]
        await batcher.close()

    with caplog.at_level("DEBUG", logger="textserve.service.engine.batcher"):
        asyncio.run(main())
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage() == "fake: tracing a batch failed"
    assert record.exc_info is not None and str(record.exc_info[1]) == "tracing broke"


def test_submit_nowait_hands_back_the_queue_wait_and_inference_time_as_submit_does() -> None:
    clock = FakeClock()
    model = TimedModel(clock)

    async def main() -> None:
        batcher: Batcher[int] = Batcher(model, BatcherConfig(), name="fake", clock=clock)
        batcher.start()
        batcher.pause()
        answers: list[Any] = []
        waited = asyncio.create_task(batcher.submit([1], [1]))
        batcher.submit_nowait([2], [1], lambda r, e: answers.append((r, e)))
        await wait_until(lambda: batcher.snapshot().queue_depth == 2)
        clock.now += 0.5
        batcher.resume()
        result = await asyncio.wait_for(waited, 5)
        await wait_until(lambda: len(answers) == 1)
        ((streamed, error),) = answers
        assert error is None
        assert (result.queue_seconds, result.inference_seconds) == (0.5, 0.25)
        assert (streamed.queue_seconds, streamed.inference_seconds) == (0.5, 0.25)
        assert streamed.outputs[:, 0].tolist() == [2]
        await batcher.close()

    asyncio.run(main())


def test_a_traced_requests_batch_span_links_every_traced_request_of_the_batch() -> None:
    """With the real RequestTrace and OpenTelemetry SDK: the span a tracer exports."""
    from types import SimpleNamespace

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from textserve.service.tracing import RequestTrace

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing: Any = SimpleNamespace(tracer=provider.get_tracer("test"))
    requests = [RequestTrace(tracing, tracing.tracer.start_span(f"r{i}")) for i in range(2)]
    model = FakeModel()

    async def main() -> None:
        attributes = {"textserve.model": "m", "textserve.model.version": 3}
        batcher: Batcher[int] = Batcher(
            model, BatcherConfig(), name="fake", trace_attributes=attributes
        )
        batcher.start()
        batcher.pause()
        tasks = [
            asyncio.create_task(batcher.submit([1, 2], [1, 2], trace=requests[0])),
            asyncio.create_task(batcher.submit([3], [1])),
            asyncio.create_task(batcher.submit([4], [3], trace=requests[1])),
        ]
        await wait_until(lambda: batcher.snapshot().queue_depth == 4)
        batcher.resume()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        await batcher.close()

    asyncio.run(main())
    after = time.time_ns()
    assert model.batches == [[1, 2, 3, 4]]
    (span,) = exporter.get_finished_spans()
    assert span.name == "batch"
    assert [link.context for link in span.links] == [r.span.get_span_context() for r in requests]
    attributes = dict(span.attributes or {})
    # the batch's run time, which is also the span's length
    seconds = attributes.pop("textserve.batch.inference_seconds")
    assert seconds == pytest.approx((span.end_time - span.start_time) / 1e9, abs=1e-8)
    assert attributes == {
        "textserve.model": "m",
        "textserve.model.version": 3,
        "textserve.batch.size": 4,
        "textserve.batch.requests": 2,
        "textserve.batch.runs": 1,
        "textserve.batch.tokens": 12,
        "textserve.batch.real_tokens": 7,
        "textserve.batch.padding_ratio": pytest.approx(5 / 12),
    }
    # the batch ran after the requests started and before the test looked
    assert max(r.span.start_time for r in requests) <= span.start_time
    assert span.start_time <= span.end_time <= after
