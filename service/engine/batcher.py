"""Dynamic batching, the asyncio driver: futures, timers and the inference thread around a queue.

Imports neither grpc nor onnxruntime. `Batcher` takes a plain callable
`run_batch(payloads) -> np.ndarray` (one output row per payload) and runs it on an executor
thread, so it is tested with fakes in microseconds and with onnxruntime in integration. A
`run_batch` that does more than one model run per batch (inference.TextRunner tokenizes the batch
and runs it as length-sorted sub-batches) returns a `BatchOutput` instead: the rows, the runs it
made (for the batch metrics) and the rows that failed (their requests fail with that error).

Which items form a batch, and when it is due, is the pure policy of queue.BatchQueue (length
buckets, the oldest item as anchor, the size, token and padding limits); this module only
drives it.

A free worker starts a batch when it is full or when its oldest item has waited
`max_queue_delay` for it to fill. With the default delay of 0 a batch starts as soon as a worker
is free: a lone request never waits, and under load batches still form, from the items that
queued while the previous batch ran. A positive delay trades latency for larger batches when the
load is light. Items whose caller cancelled or whose deadline passed are dropped before
inference. The queue is bounded: a request that does not fit is refused at once.

Threads: the event loop queues items and hands results back; the executor thread runs batches
back to back. When a batch finishes, the thread itself takes the next one that is due (under
`_lock`, the one lock of the BatchQueue) and posts the finished batch's results to the loop, so the
model never waits for the loop. Measured before this (default model, 2 cores, 128 callers): the
loop, busy with gRPC, took ~10 ms to come back for the next batch after each ~35 ms batch, and
the inference thread idled 22% of the time with work queued (27% at 16 callers). Only the loop
touches futures, timers and observers; the thread reads a future's done() (to drop a cancelled
item) and asks the loop to fail expired ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Generic, TypeVar

import numpy as np

from textserve.service.config import BatcherConfig
from textserve.service.engine.admission import Admission
from textserve.service.engine.batches import (
    BatchObserver,
    BatchOutput,
    BatchResult,
    BatchStats,
    BatchTrace,
    NullObserver,
    RunStats,
)
from textserve.service.engine.priority import lower_priority
from textserve.service.engine.queue import BatchQueue, QueueItem
from textserve.service.errors import (
    DeadlineExceededError,
    InternalError,
    NotReadyError,
    OverloadedError,
)

logger = logging.getLogger(__name__)

P = TypeVar("P")  # a payload: whatever run_batch needs per item (texts, for the model)


class _Request:
    """One caller's items: results are written into `outputs`, one future per request."""

    __slots__ = (
        "deadline",
        "enqueued",
        "future",
        "last_batch",
        "n",
        "outputs",
        "queue_seconds",
        "remaining",
        "run_seconds",
        "seq",
        "timer",
        "trace",
    )

    def __init__(
        self,
        n: int,
        future: asyncio.Future[None],
        enqueued: float,
        seq: int,
        trace: BatchTrace | None,
    ) -> None:
        self.n = n
        self.future = future
        self.enqueued = enqueued
        self.seq = seq
        self.remaining = n
        self.outputs: np.ndarray | None = None
        self.deadline: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.queue_seconds = 0.0
        self.run_seconds = 0.0
        self.last_batch = -1
        self.trace = trace

    def answered(self) -> bool:
        """Cancelled, expired or failed (read by the inference thread too: done() is safe)."""
        return self.future.done()


_Item = QueueItem[_Request]


class Batcher(Generic[P]):
    """The queue and batching loop of one model version. Use on one event loop:

    >>> batcher = Batcher(lambda payloads: np.ones((len(payloads), 2)), BatcherConfig())
    >>> async def demo():
    ...     batcher.start()
    ...     result = await batcher.submit(["a", "bb"], [1, 2])
    ...     await batcher.close()
    ...     return result.outputs.shape
    >>> asyncio.run(demo())
    (2, 2)
    """

    def __init__(
        self,
        run_batch: Callable[[list[P]], np.ndarray | BatchOutput],
        config: BatcherConfig,
        *,
        executor: Executor | None = None,
        workers: int = 1,
        nice: int = 0,
        observer: BatchObserver | None = None,
        name: str = "model",
        clock: Callable[[], float] = time.monotonic,
        trace_attributes: Mapping[str, str | int] | None = None,
    ) -> None:
        # The batch function (replaceable before start(): ModelHandle.use_engine)
        self.run_batch = run_batch
        # What a batch span says of the model (model, version, provider), when one is traced.
        self.trace_attributes: Mapping[str, str | int] = trace_attributes or {}
        self.config = config
        self.name = name
        self._own_executor = executor is None
        # Its threads tokenize and run batches `nice` below the loop (engine/priority.py).
        self._executor = executor or ThreadPoolExecutor(
            workers, f"infer-{name}", initializer=lower_priority, initargs=(nice,)
        )
        self._workers_n = workers
        self._observer = observer or NullObserver()
        self._clock = clock
        # Guarded by _lock: the loop adds and takes items, the executor thread takes the next
        # batch itself (see _chain).
        self._queue: BatchQueue[_Request] = BatchQueue(config, name)
        self._inflight = 0  # items of requests submitted and not yet answered (the scaling signal)
        self._seq = 0
        self._batch_seq = 0
        self._running_batches = 0
        self.stats = BatchStats()
        self._closed = False
        self._flushing = False
        self._wakeup: asyncio.Event | None = None
        self._resumed: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._lock = threading.Lock()  # the queue's, between the loop and the executor thread
        # Admission by time (config.max_queue_wait): the drain rate and the expected wait.
        self._admission = Admission(config.max_queue_wait, name, workers)
        self._stopping = False  # set when the workers are cancelled: chains take no more

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the batching workers on the running loop."""
        self._wakeup = asyncio.Event()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks = [
            asyncio.get_running_loop().create_task(self._worker(), name=f"batcher-{self.name}")
            for _ in range(self._workers_n)
        ]

    def pause(self) -> None:
        """Hold batches back (items keep queueing) until resume() or flush().

        No serving path pauses. It is kept because it is the deterministic way to queue work
        before a batch starts: the batcher's, runner's and repository's tests pause, submit,
        wait for the queue depth, then resume, instead of racing the batch delay.
        """
        assert self._resumed is not None, "start() first"
        self._resumed.clear()

    def resume(self) -> None:
        """Let batches go again after pause(); flush() resumes too, so a drain is never held."""
        assert self._resumed is not None, "start() first"
        self._resumed.set()

    def flush(self) -> None:
        """Stop waiting for batches to fill: the drain phase runs everything queued at once."""
        self._flushing = True
        self.resume()
        self._wake()

    async def close(self, timeout: float | None = 0.0) -> None:
        """Refuse new work, let queued work run for up to `timeout` seconds (None: no limit),
        then fail what is left with NotReadyError and stop the workers."""
        self._closed = True
        self.flush()
        if self._idle is not None and timeout != 0:
            try:
                await asyncio.wait_for(self._wait_idle(), timeout)
            except TimeoutError:
                logger.warning(
                    "%s: %d queued texts left after the grace period", self.name, len(self._queue)
                )
        self._stopping = True  # before the workers are cancelled: no chain takes a batch after
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        left = self._pop_all()
        if left:
            logger.warning("%s: cancelled %d queued texts at shutdown", self.name, left)
        if self._own_executor:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def _wait_idle(self) -> None:
        assert self._idle is not None
        while self._queue or self._running_batches:
            self._idle.clear()
            await self._idle.wait()

    # -- submitting --------------------------------------------------------------------------

    def expected_wait(self) -> float:
        """Seconds of work queued ahead of a new request (see engine/admission.py)."""
        return self._admission.expected_wait(self._queue.tokens)

    def _check_room(self, n: int, deadline: float | None, now: float) -> None:
        """Refuse at once what the queue cannot take (engine/admission.py), counted."""
        try:
            self._queue.check_room(n)
            self._admission.check(self._queue.tokens, deadline, now)
        except OverloadedError as exc:
            self.stats.rejected_overloaded += 1
            self._observer.on_refused(getattr(exc, "reason", "queue_full"))
            raise
        except DeadlineExceededError:
            self.stats.rejected_deadline += 1
            self._observer.on_refused("deadline")
            raise

    async def submit(
        self,
        payloads: Sequence[P],
        lengths: Sequence[int],
        *,
        deadline: float | None = None,
        trace: BatchTrace | None = None,
    ) -> BatchResult:
        """Queue one request's items and wait for their outputs.

        `trace`: the request's trace (tracing on, request sampled); each batch that carries
        any of its items is reported to it (see BatchTrace).

        `deadline` is absolute, on the batcher's clock (time.monotonic()). Raises
        OverloadedError at once when the queue cannot take all items, DeadlineExceededError
        when the deadline passes first, NotReadyError once closed. Texts are tokenized by the
        worker, after they are queued, so a refused request costs no tokenization.
        """
        request = self._enqueue(payloads, lengths, deadline, trace)
        try:
            await request.future
        finally:
            self._release(request)
        assert request.outputs is not None
        return BatchResult(request.outputs, request.queue_seconds, request.run_seconds)

    def submit_nowait(
        self,
        payloads: Sequence[P],
        lengths: Sequence[int],
        done: Callable[[BatchResult | None, BaseException | None], None],
        *,
        deadline: float | None = None,
        trace: BatchTrace | None = None,
    ) -> asyncio.Future[None]:
        """submit() without a coroutine, for a caller with many requests in flight (a stream):
        queue the items now (raising as submit() does) and call `done(result, None)` or
        `done(None, exception)` on the loop when they are answered. Cancel the returned future
        to drop the items (`done` then gets a CancelledError)."""
        request = self._enqueue(payloads, lengths, deadline, trace)

        def finished(future: asyncio.Future[None]) -> None:
            self._release(request)
            if future.cancelled():
                done(None, asyncio.CancelledError())
            elif (exc := future.exception()) is not None:
                done(None, exc)
            else:
                assert request.outputs is not None
                done(BatchResult(request.outputs, request.queue_seconds, request.run_seconds), None)

        request.future.add_done_callback(finished)
        return request.future

    def _enqueue(
        self,
        payloads: Sequence[P],
        lengths: Sequence[int],
        deadline: float | None,
        trace: BatchTrace | None = None,
    ) -> _Request:
        """Queue one request's items (see submit); _release it once its future is done."""
        n = len(payloads)
        if n == 0 or len(lengths) != n:
            raise ValueError(f"submit needs one length per payload, got {n} and {len(lengths)}")
        if self._closed or self._wakeup is None:
            raise NotReadyError(f"model {self.name!r} is not accepting requests (shutting down)")
        now = self._clock()
        if deadline is not None and deadline <= now:
            raise DeadlineExceededError("the deadline had passed before the request was queued")
        self._check_room(n, deadline, now)
        loop = asyncio.get_running_loop()
        self._seq += 1
        request = _Request(n, loop.create_future(), now, self._seq, trace)
        with self._lock:
            self._queue.add(request, payloads, lengths)
        self._observer.on_queue_depth(len(self._queue))
        self._inflight += n
        self._observer.on_inflight(self._inflight)
        self._wake()
        if deadline is not None:
            request.deadline = deadline
            request.timer = loop.call_later(deadline - now, self._expire, request)
        return request

    def _release(self, request: _Request) -> None:
        if request.timer is not None:
            request.timer.cancel()
        self._inflight -= request.n
        self._observer.on_inflight(self._inflight)

    def _expire(self, request: _Request) -> None:
        if not request.future.done():
            waited = self._clock() - request.enqueued
            request.future.set_exception(
                DeadlineExceededError(
                    f"deadline exceeded after {waited:.3f}s waiting for model {self.name!r}"
                )
            )

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    # -- batching ----------------------------------------------------------------------------

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wait_for_batch()
            with self._lock:
                batch = self._take_batch(self._clock(), self._expire)
            self._observer.on_queue_depth(len(self._queue))
            if not batch:
                self._notify_idle()
                continue
            self._running_batches += 1
            try:
                await self._run(loop, batch)
            finally:
                self._running_batches -= 1
                self._notify_idle()

    def _notify_idle(self) -> None:
        if self._idle is not None and not self._queue and not self._running_batches:
            self._idle.set()

    async def _wait_for_batch(self) -> None:
        """Return when a batch should start: full, oldest item waited long enough, or flushing."""
        wakeup, resumed = self._wakeup, self._resumed
        assert wakeup is not None and resumed is not None
        while True:
            if not resumed.is_set():
                await resumed.wait()
                continue
            with self._lock:  # another worker's thread may be taking items, even the last
                wait = self._queue.time_to_batch(self._clock(), flushing=self._flushing)
            if wait is None:
                wakeup.clear()
                await wakeup.wait()
                continue
            if wait <= 0:
                return
            # A timer that sets the event, rather than asyncio.wait_for (a task per wait).
            wakeup.clear()
            timer = asyncio.get_running_loop().call_later(wait, wakeup.set)
            try:
                await wakeup.wait()
            finally:
                timer.cancel()

    def _due(self, now: float) -> bool:
        """Whether the executor thread should start a batch now (see _wait_for_batch)."""
        if self._stopping or not (self._resumed is not None and self._resumed.is_set()):
            return False
        wait = self._queue.time_to_batch(now, flushing=self._flushing)
        return wait is not None and wait <= 0

    def _take_batch(self, now: float, expire: Callable[[_Request], None]) -> list[_Item]:
        """Pop the next batch (BatchQueue.take). Call with _lock held; `expire` fails a request
        whose deadline passed in the queue."""

        def drop(request: _Request, expired: bool) -> None:
            if expired:
                expire(request)
                self.stats.dropped_deadline += 1
            else:
                self._count_drop(request)

        return self._queue.take(now, drop)

    def _count_drop(self, request: _Request) -> None:
        future = request.future
        if not future.cancelled() and isinstance(future.exception(), DeadlineExceededError):
            self.stats.dropped_deadline += 1
        else:
            self.stats.dropped_cancelled += 1

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Item]) -> None:
        running = [batch]  # the chain's current batch, kept up to date by the thread
        try:
            last = await loop.run_in_executor(self._executor, self._chain, loop, running)
        except asyncio.CancelledError:
            # by close(), which set _stopping first, so the chain takes no further batch. (A
            # loop shut down without close() lets a chain run what is queued before the thread
            # ends; textserve always closes its batchers: retire, unload, server shutdown.)
            with self._lock:
                current = running[0]
            self._fail(current, NotReadyError(f"model {self.name!r} stopped during inference"))
            raise
        self._deliver(*last)

    def _chain(
        self, loop: asyncio.AbstractEventLoop, running: list[list[_Item]]
    ) -> tuple[list[_Item], np.ndarray | BatchOutput | None, Exception | None, float, float]:
        """Executor thread: run `running[0]`; while another batch is due, take it, post the
        finished one's results to the loop and run it. The last batch's results are returned
        (the loop's worker delivers them: one wake-up of the loop per batch when idle)."""

        def expire(request: _Request) -> None:
            loop.call_soon_threadsafe(self._expire, request)

        batch = running[0]
        while True:
            started = self._clock()
            try:
                result: np.ndarray | BatchOutput | None = self.run_batch(
                    [item.payload for item in batch]
                )
                failure: Exception | None = None
            except Exception as exc:  # reported by _deliver, on the loop
                result, failure = None, exc
            finished = self._clock()
            with self._lock:
                nxt = self._take_batch(finished, expire) if self._due(finished) else []
                if nxt:
                    running[0] = nxt
            if not nxt:
                return batch, result, failure, started, finished
            try:
                loop.call_soon_threadsafe(self._deliver, batch, result, failure, started, finished)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                return nxt, None, NotReadyError("the event loop closed"), finished, finished
            batch = nxt

    def _deliver(
        self,
        batch: list[_Item],
        result: np.ndarray | BatchOutput | None,
        failure: Exception | None,
        started: float,
        finished: float,
    ) -> None:
        """On the loop: hand a finished batch's rows to its callers and count it."""
        self._observer.on_queue_depth(len(self._queue))
        self._batch_seq += 1
        batch_id = self._batch_seq
        if failure is None and result is not None:
            if isinstance(result, BatchOutput):
                outputs, runs, errors = result.outputs, result.runs, result.errors
            else:
                outputs, runs, errors = result, None, None
            if len(outputs) != len(batch):
                failure = RuntimeError(
                    f"run_batch returned {len(outputs)} rows for {len(batch)} items"
                )
        if failure is not None or result is None:
            # Logged once here rather than once per caller; callers get a ServiceError.
            logger.error(
                "%s: inference failed for a batch of %d", self.name, len(batch), exc_info=failure
            )
            self._fail(batch, InternalError(f"inference failed ({type(failure).__name__})"))
            return
        seconds = finished - started
        self._measure_drain(batch, seconds)
        if runs is None:
            lengths = [item.length for item in batch]
            runs = (RunStats(len(batch), len(batch) * max(lengths), sum(lengths), seconds),)
        self._count_runs(runs)
        self._observer.on_queue_waits([started - item.request.enqueued for item in batch])
        traces: dict[int, BatchTrace] | None = None
        for row, item in enumerate(batch):
            request = item.request
            if request.trace is not None:
                traces = traces or {}
                traces[id(request)] = request.trace
            future = request.future
            if future.done():
                continue  # the caller left while its batch ran, or another of its items failed
            if errors and row in errors:
                future.set_exception(errors[row])
                continue
            if request.outputs is None:
                request.outputs = np.empty((request.n, *outputs.shape[1:]), outputs.dtype)
            request.outputs[item.row] = outputs[row]
            request.queue_seconds = max(request.queue_seconds, started - request.enqueued)
            if request.last_batch != batch_id:
                request.last_batch = batch_id
                request.run_seconds += seconds
            request.remaining -= 1
            if not request.remaining:
                future.set_result(None)
        if traces:
            self._trace_batch(list(traces.values()), started, seconds, runs)

    def _measure_drain(self, batch: list[_Item], seconds: float) -> None:
        """Fold one batch into the drain rate and publish the expected wait."""
        self._admission.drained(sum(item.length for item in batch), seconds)
        self._observer.on_expected_wait(self.expected_wait())

    def _trace_batch(
        self, traces: list[BatchTrace], started: float, seconds: float, runs: Sequence[RunStats]
    ) -> None:
        """Report a batch to its traced requests; tracing never fails a batch."""
        try:
            traces[0].on_batch(
                traces, self._clock() - started, seconds, runs, self.trace_attributes
            )
        except Exception:
            logger.exception("%s: tracing a batch failed", self.name)

    def _count_runs(self, runs: Sequence[RunStats]) -> None:
        stats, observe = self.stats, self._observer.on_batch
        for run in runs:
            if not run.size:
                continue
            stats.batches += 1
            stats.items += run.size
            stats.max_batch_size_seen = max(stats.max_batch_size_seen, run.size)
            stats.padded_tokens += run.padded_tokens
            stats.padding_tokens += run.padded_tokens - run.real_tokens
            ratio = 1.0 - run.real_tokens / run.padded_tokens if run.padded_tokens else 0.0
            observe(run.size, run.padded_tokens, ratio, run.seconds)

    def _fail(self, batch: list[_Item], exc: Exception) -> None:
        for item in batch:
            if not item.request.future.done():
                item.request.future.set_exception(exc)

    def _pop_all(self) -> int:
        left = 0
        with self._lock:
            items = self._queue.clear()
        for item in items:
            if not item.request.future.done():
                left += 1
                item.request.future.set_exception(
                    NotReadyError(f"model {self.name!r} shut down before this request ran")
                )
        self._observer.on_queue_depth(0)
        return left

    def snapshot(self) -> BatchStats:
        """A copy of the statistics with the current queue depth."""
        stats = BatchStats(**{k: getattr(self.stats, k) for k in BatchStats.__dataclass_fields__})
        stats.queue_depth = len(self._queue)
        return stats
