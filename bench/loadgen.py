"""The load generator: closed loop (N callers, each waits for its answer), open loop (Poisson
arrivals at a fixed rate) and streams (N ClassifyStream calls with M messages in flight each),
many coroutines over grpc.aio channels in this process: one by default, `connections=N` for a
server of N worker processes (the kernel hands each worker whole connections, so one
connection would load one worker; `workers=N` spreads them evenly: spread_channels).

    raw = asyncio.run(closed_loop("127.0.0.1:50051", pool, concurrency=64, warmup=1, duration=5))
    raw = asyncio.run(stream_loop("127.0.0.1:50051", pool, streams=4, inflight=32, warmup=1,
                                  duration=5))

It must stay cheap because it shares the machine with the server: requests are serialized
ahead (see requests.py) and answers are not parsed — a gRPC status is all a step needs.
Latency in the open loop runs from the *scheduled* arrival, so a late send (the loop was busy)
counts against the server rather than vanishing (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import numpy as np

from textserve.bench.requests import RequestPool
from textserve.bench.stats import RawStep, read_machine_cpu
from textserve.spread import check_async, spread_async

# Called at the start and at the end of the measured window (e.g. to scrape server metrics).
Probe = Callable[[], Awaitable[Any]]

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


class HttpStatusError(Exception):
    """An HTTP answer other than 200 (the step's error code: HTTP_429, ...), or no answer
    (HTTP_CONNECTION: the connection failed or was closed)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


ERRORS = (grpc.aio.AioRpcError, HttpStatusError, asyncio.TimeoutError)


def error_code(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return str(exc.code().name)
    return exc.code if isinstance(exc, HttpStatusError) else "TIMEOUT"


# Connections of the HTTP client at most (HTTP/1.1: one per request in flight); past it a
# request waits for a free one, counted in its latency from its scheduled arrival. Bounded as
# every HTTP client library bounds its pool (aiohttp and httpx 100, urllib3 10 per host), here
# at twice the server's default bound on requests in flight so that the server's 429s are
# exercised. 0: unbounded (a connection per waiting request: measured, a storm of thousands of
# connections on the same two cores that collapses the server's goodput; docs/performance.md).
HTTP_POOL = 1024


def http_pool(asked: int | None, workers: int) -> int:
    """The HTTP client's connections at most: as asked, else HTTP_POOL per server worker. An
    HTTP/1.1 client sends no more requests at once than it has connections; a pool no larger
    than what the server's workers let in at once together (512 each) makes the open loop a
    closed loop of that many callers (measured, two workers and 1,024 connections: arrivals
    held in the client's pool, the server's door never seeing the overload, accepted p99 15.3x;
    bench/results/overload/http-pool-workers)."""
    return HTTP_POOL * workers if asked is None else asked


@contextlib.asynccontextmanager
async def _http_calls(target: str, path: str, pool: int = HTTP_POOL) -> AsyncIterator[list[Any]]:
    """An HTTP call object (POST of a serialized JSON body, the answer read, not parsed) over a
    pool of keep-alive connections, as many as there are requests in flight (HTTP/1.1) up to
    `pool` (0: no bound)."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=pool, force_close=False)
    url = f"http://{target}{path}"
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:

        async def call(payload: bytes, timeout: float) -> None:
            limit = aiohttp.ClientTimeout(total=timeout)
            try:
                async with session.post(url, data=payload, headers=headers, timeout=limit) as r:
                    await r.read()
                    status = r.status
            except aiohttp.ClientError:
                raise HttpStatusError("HTTP_CONNECTION") from None
            if status != 200:
                raise HttpStatusError(f"HTTP_{status}")

        yield [call]


def _channel(target: str, index: int) -> grpc.aio.Channel:
    """A channel that is its own connection (channels with equal options share one)."""
    options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1), ("bench.connection", index)]
    return grpc.aio.insecure_channel(target, options=options)


async def _check(channel: grpc.aio.Channel) -> Any:
    """The initial metadata of a health Check answer on `channel` (textserve.spread's keys)."""
    return await check_async(channel, timeout=10.0)


async def spread_channels(target: str, connections: int) -> list[grpc.aio.Channel]:
    """`connections` channels, each its own connection, as evenly over the processes of a
    `--workers N` server as they divide (textserve.spread: the kernel hands each connection to
    a worker at random, so connections opened blindly split unevenly more often than not, and
    a load spread over them would load one worker with most of it). An error when they cannot
    be spread: a benchmark row on an uneven split would measure the split."""
    first = [_channel(target, i) for i in range(connections)]
    serve, close, plan = await spread_async(first, lambda i: _channel(target, i), _check)
    await asyncio.gather(*(c.close() for c in close))
    if plan.exhausted:
        await asyncio.gather(*(c.close() for c in serve))
        raise RuntimeError(
            f"could not spread {connections} connections over the server's {plan.workers} "
            f"workers (held {plan.split()} after {plan.tries} connections)"
        )
    return serve


@contextlib.asynccontextmanager
async def _calls(
    target: str,
    method: str,
    connections: int,
    stream: bool = False,
    http_pool: int = HTTP_POOL,
    workers: int = 1,
) -> AsyncIterator[list[Any]]:
    """One bytes-in, bytes-out call object per connection (its own channel and connection);
    `stream`: a bidirectional-streaming one. `workers` > 1: the connections spread evenly over
    a `--workers` server's processes (spread_channels). A method that is an HTTP path
    (requests.METHODS' "http"): POSTs to `target`'s HTTP port instead (its pool of hundreds
    of connections spreads by itself)."""
    if connections < 1:
        raise ValueError(f"connections must be at least 1, got {connections}")
    if method.startswith("/v1/"):
        async with _http_calls(target, method, http_pool) as calls:
            yield calls
        return
    if workers > 1 and connections > 1:
        channels = await spread_channels(target, connections)
    elif connections > 1:
        channels = [_channel(target, i) for i in range(connections)]
    else:
        channels = [grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)]
    try:
        await asyncio.gather(*(c.channel_ready() for c in channels))
        # no (de)serialization: requests are serialized ahead, answers not parsed
        yield [c.stream_stream(method) if stream else c.unary_unary(method) for c in channels]
    finally:
        await asyncio.gather(*(c.close() for c in channels))


def poisson_arrivals(rate: float, duration: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (seconds from 0, ascending, < duration) of a Poisson process of `rate`/s.

    >>> len(poisson_arrivals(1000.0, 2.0, np.random.default_rng(0))) in range(1850, 2150)
    True
    """
    if rate <= 0 or duration <= 0:
        raise ValueError(f"rate and duration must be positive, got {rate} and {duration}")
    expected = rate * duration
    chunk = int(expected + 6 * np.sqrt(expected) + 16)
    times = np.cumsum(rng.exponential(1.0 / rate, chunk))
    while times[-1] < duration:  # rare: draw more gaps
        times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(1.0 / rate, chunk))])
    return times[times < duration]


class _Window:
    """The measured window of a step: warm-up first, then `duration` seconds."""

    def __init__(self, warmup: float, duration: float, probe: Probe | None) -> None:
        self.t0 = time.perf_counter()
        self.start = self.t0 + warmup
        self.end = self.start + duration
        self.probe = probe
        self.samples: list[Any] = []
        self.cpu = 0.0
        self.machine_share: float | None = None

    async def watch(self) -> None:
        """Take the probe and this process's CPU time at both edges of the window."""
        await asyncio.sleep(max(0.0, self.start - time.perf_counter()))
        if self.probe is not None:
            self.samples.append(await self.probe())
        cpu0, machine0 = time.process_time(), read_machine_cpu()
        await asyncio.sleep(max(0.0, self.end - time.perf_counter()))
        self.cpu = time.process_time() - cpu0
        machine1 = read_machine_cpu()
        if machine0 and machine1 and machine1[1] > machine0[1]:
            self.machine_share = (machine1[0] - machine0[0]) / (machine1[1] - machine0[1])
        if self.probe is not None:
            self.samples.append(await self.probe())


async def closed_loop(
    target: str,
    pool: RequestPool,
    concurrency: int,
    *,
    warmup: float,
    duration: float,
    timeout: float = 10.0,
    probe: Probe | None = None,
    connections: int = 1,
    workers: int = 1,
) -> tuple[RawStep, list[Any]]:
    """`concurrency` callers, each sending its next request as soon as the last is answered
    (caller i over connection i mod `connections`, spread over `workers`: _calls). Counts
    the requests that complete inside the window; returns the step and probe samples."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    payloads = pool.payloads
    n_payloads = len(payloads)
    per_request = pool.texts_per_request
    raw = RawStep(window_seconds=duration)
    latencies = raw.latencies
    errors = raw.errors
    counter = itertools.count()
    async with _calls(target, pool.method, connections, workers=workers) as calls:
        window = _Window(warmup, duration, probe)
        start, end = window.start, window.end
        clock = time.perf_counter

        async def caller(call: Any) -> None:
            while True:
                sent = clock()
                if sent >= end:
                    return
                payload = payloads[next(counter) % n_payloads]
                try:
                    await call(payload, timeout=timeout)
                    code = None
                except ERRORS as exc:
                    code = error_code(exc)
                done = clock()
                if start <= done < end:
                    if code is None:
                        latencies.append(done - sent)
                    else:
                        errors[code] += 1
                        raw.error_latencies.setdefault(code, []).append(done - sent)

        watcher = asyncio.create_task(window.watch())
        await asyncio.gather(*(caller(calls[i % len(calls)]) for i in range(concurrency)))
        await watcher
    raw.texts = len(latencies) * per_request
    raw.requests_done = len(latencies)
    raw.loadgen_cpu_seconds = window.cpu
    raw.machine_cpu_share = window.machine_share
    return raw, window.samples


async def open_loop(
    target: str,
    pool: RequestPool,
    rate: float,
    *,
    warmup: float,
    duration: float,
    timeout: float = 10.0,
    max_in_flight: int = 20000,
    seed: int = 0,
    probe: Probe | None = None,
    connections: int = 1,
    http_pool: int = HTTP_POOL,
    workers: int = 1,
) -> tuple[RawStep, list[Any]]:
    """Requests arriving as a Poisson process of `rate` requests/s, whatever the server does
    (over `connections` in turn, spread over `workers`: _calls). Latency and errors: requests
    that arrive inside the window (waited for, up to `timeout`). Throughput: requests that
    complete inside the window — what the server really delivered, also above capacity."""
    arrivals = poisson_arrivals(rate, warmup + duration, np.random.default_rng(seed))
    payloads, per_request = pool.payloads, pool.texts_per_request
    n_payloads = len(payloads)
    raw = RawStep(window_seconds=duration)
    latencies, errors, outcomes = raw.latencies, raw.errors, raw.outcomes
    done_in_window = in_flight = 0
    async with _calls(
        target, pool.method, connections, http_pool=http_pool, workers=workers
    ) as calls:
        next_call = itertools.cycle(calls).__next__
        window = _Window(warmup, duration, probe)
        start, end, t0 = window.start, window.end, window.t0
        clock = time.perf_counter

        async def send(payload: bytes, scheduled: float) -> None:
            nonlocal done_in_window, in_flight
            try:
                await next_call()(payload, timeout=timeout)
                code = None
            except ERRORS as exc:
                code = error_code(exc)
            finally:
                in_flight -= 1
            done = clock()
            if code is None and start <= done < end:
                done_in_window += 1
            if start <= scheduled < end:
                if code is None:
                    latencies.append(done - scheduled)
                else:
                    errors[code] += 1
                    raw.error_latencies.setdefault(code, []).append(done - scheduled)
                outcomes.append((scheduled - start, done - scheduled, code))

        watcher = asyncio.create_task(window.watch())
        tasks: set[asyncio.Task[None]] = set()
        i, n = 0, len(arrivals)
        while i < n:
            now = clock() - t0
            while i < n and arrivals[i] <= now:
                scheduled = t0 + arrivals[i]
                if in_flight >= max_in_flight:
                    if start <= scheduled < end:
                        raw.not_sent += 1
                else:
                    in_flight += 1
                    task = asyncio.create_task(send(payloads[i % n_payloads], scheduled))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                i += 1
            if i < n:
                await asyncio.sleep(arrivals[i] - (clock() - t0))
        await watcher
        if tasks:
            await asyncio.gather(*tasks)
    raw.texts = done_in_window * per_request
    raw.requests_done = done_in_window
    raw.loadgen_cpu_seconds = window.cpu
    raw.machine_cpu_share = window.machine_share
    return raw, window.samples


def response_id(data: bytes) -> tuple[bytes, bool]:
    """The `id` (field 1) of a serialized ClassifyResponse and whether it is an error response,
    without parsing it: protobuf serializers write fields in field-number order, so a non-empty
    id comes first, and an error response (id and `error`, field 7) has `error` next where an
    answer has `model` (field 2). The load generator matches answers to requests by id (a
    stream answers in completion order).

    >>> response_id(b"\\x0a\\x0212\\x12\\x01m")
    (b'12', False)
    >>> response_id(b"\\x0a\\x0212\\x3a\\x02\\x08\\x08")
    (b'12', True)
    """
    if len(data) < 2 or data[0] != 0x0A:
        return b"", False
    length, start = data[1], 2
    if length & 0x80:  # a two-byte varint length: ids of 128+ bytes (never ours)
        length, start = (length & 0x7F) | (data[2] << 7), 3
    end = start + length
    return data[start:end], data[end : end + 1] == b"\x3a"


_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def _error_code(data: bytes) -> str:
    """The gRPC code name of an error response."""
    from textserve.v1 import classifier_pb2 as pb

    return _CODE_NAMES.get(pb.ClassifyResponse.FromString(data).error.code, "UNKNOWN")


async def stream_loop(
    target: str,
    pool: RequestPool,
    streams: int,
    inflight: int,
    *,
    warmup: float,
    duration: float,
    timeout: float = 10.0,
    probe: Probe | None = None,
    connections: int = 1,
    workers: int = 1,
) -> tuple[RawStep, list[Any]]:
    """`streams` ClassifyStream calls (stream i over connection i mod `connections`, spread
    over `workers`: _calls), each keeping `inflight` messages unanswered: a message is sent as
    soon as one is answered (a closed loop per stream). Latency: from a message's write to its
    answer's read. Counts the messages answered inside the window. `pool.payloads` must carry
    distinct ids (requests.build_requests does for the stream API)."""
    if streams < 1 or inflight < 1:
        raise ValueError(f"streams and inflight must be at least 1, got {streams}, {inflight}")
    payloads = pool.payloads
    n_payloads = len(payloads)
    if inflight > n_payloads:
        raise ValueError(f"inflight {inflight} is more than the {n_payloads} distinct requests")
    ids = pool.ids
    per_request = pool.texts_per_request
    raw = RawStep(window_seconds=duration)
    latencies, errors = raw.latencies, raw.errors
    async with _calls(target, pool.method, connections, stream=True, workers=workers) as calls:
        window = _Window(warmup, duration, probe)
        start, end = window.start, window.end
        clock = time.perf_counter

        async def one_stream(index: int, call_factory: Any) -> None:
            call = call_factory(timeout=warmup + duration + timeout)
            sent: dict[bytes, float] = {}
            permits = asyncio.Semaphore(inflight)

            async def write() -> None:
                i = index * 7919  # streams start at different texts
                try:
                    while clock() < end:
                        await permits.acquire()
                        k = i % n_payloads
                        i += 1
                        sent[ids[k]] = clock()
                        await call.write(payloads[k])
                    await call.done_writing()
                except asyncio.InvalidStateError:  # the call ended (an error): read() says why
                    pass

            writer = asyncio.create_task(write())
            try:
                while True:
                    data = await call.read()
                    if data is grpc.aio.EOF:
                        break
                    done = clock()
                    key, failed = response_id(data)
                    sent_at = sent.pop(key, None)
                    permits.release()
                    if sent_at is None or not start <= done < end:
                        continue
                    if failed:
                        errors[_error_code(data)] += 1
                    else:
                        latencies.append(done - sent_at)
                await writer
            except grpc.aio.AioRpcError as exc:
                writer.cancel()
                errors[exc.code().name] += 1

        watcher = asyncio.create_task(window.watch())
        await asyncio.gather(*(one_stream(i, calls[i % len(calls)]) for i in range(streams)))
        await watcher
    raw.texts = len(latencies) * per_request
    raw.requests_done = len(latencies)
    raw.loadgen_cpu_seconds = window.cpu
    raw.machine_cpu_share = window.machine_share
    return raw, window.samples
