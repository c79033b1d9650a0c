"""What the dynamic batcher tells: its statistics and observer, the queue wait and inference
time of each result, and the trace of a traced request (a fake run_batch)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

from tests.unit.service.engine.batcher_fakes import (
    FakeClock,
    FakeModel,
    FullRecorder,
    Recorder,
    TimedModel,
    run,
    wait_until,
)
from textserve.service.config import BatcherConfig
from textserve.service.engine.batcher import Batcher, BatchStats, RunStats


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


# -- statistics and the observer ---------------------------------------------------------------


def test_the_observer_is_told_each_batch_each_queue_wait_and_the_depth() -> None:
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


def test_the_mean_batch_size_is_items_per_batch_and_zero_before_any() -> None:
    stats = BatchStats(batches=4, items=10)
    assert stats.mean_batch_size == 2.5
    assert BatchStats().mean_batch_size == 0.0


# -- the queue wait and inference time handed back ---------------------------------------------


def test_a_result_reports_its_queue_wait_and_inference_time() -> None:
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


# -- tracing: what the trace of a traced request is told of its batches ------------------------


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
