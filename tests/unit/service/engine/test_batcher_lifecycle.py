"""The dynamic batcher's life: its executor, flush (the drain), close with and without a grace,
and a run_batch that fails, returns nothing or the wrong rows (a fake run_batch)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from tests.unit.service.engine.batcher_fakes import (
    FakeModel,
    FullRecorder,
    GatedByPayload,
    wait_until,
)
from textserve.service.config import BatcherConfig
from textserve.service.engine.batcher import Batcher, BatchOutput, RunStats
from textserve.service.errors import (
    InternalError,
    NotReadyError,
    ValidationError,
)

# -- the executor: lent or its own -------------------------------------------------------------


def test_an_executor_passed_in_is_left_running_and_an_own_one_is_shut_down() -> None:

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


# -- flush: what is queued runs at once --------------------------------------------------------


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


# -- close with a grace: queued work finishes, up to the grace ---------------------------------


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


def test_close_with_a_grace_waits_for_the_batch_of_every_worker() -> None:
    model = GatedByPayload(1, 2)
    gates, entered = model.gates, model.entered

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


# -- close without a grace: what is left fails, and says so ------------------------------------


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


def test_close_leaves_no_queued_item_to_a_chain_nobody_will_answer() -> None:
    """A batch that finishes while close() stops the workers takes no further batch: what is
    still queued is failed by close(), not run by a thread whose results nobody delivers."""

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
    model = GatedByPayload(1, 2)
    gates, entered = model.gates, model.entered

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


# -- failures of run_batch: the batch fails, the batcher goes on -------------------------------


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
