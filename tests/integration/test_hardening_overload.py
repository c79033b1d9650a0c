"""Overload: open-loop load at several times the measured capacity, for a few seconds, against a
`textserve serve` child process with a small queue (--max-queue-size 64 texts).

The health service keeps answering SERVING, the server's resident memory stays under a stated
bound, excess requests get RESOURCE_EXHAUSTED (refused at once: never a timeout), accepted
requests meet their deadlines, and the queue is empty again afterwards. Figures are printed
(pytest -s) for the README; nothing here asserts a speed.
"""

from __future__ import annotations

import asyncio
import random
import re
import statistics
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.serving import running_server, serve_subprocess
from textserve.oip import grpc_service_pb2 as ipb
from textserve.oip import grpc_service_pb2_grpc as ipb_grpc
from textserve.service.config import BatcherConfig
from textserve.service.dataplane.oip_codec import pack_bytes
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

FACTOR = 4.0  # offered load / measured capacity
DURATION = 3.0  # seconds of overload
DEADLINE = 5.0  # seconds each request allows; the queue bound keeps accepted ones well inside
QUEUE = 64  # texts (4 requests of 16)
RSS_HEADROOM = 64 * 1024 * 1024  # bytes the server may grow over its warm baseline
WORDS = "a gripping beautifully acted film with a dull plot and wooden dialogue".split()  # noqa: SIM905
rng = random.Random(0)
TEXTS = [" ".join(rng.choice(WORDS) for _ in range(40)) for _ in range(16)]  # ~max_length each


class Sampler(threading.Thread):
    """Calls `sample()` every `interval` seconds until stopped; keeps what it returns."""

    def __init__(self, sample: Any, interval: float) -> None:
        super().__init__(daemon=True)
        self.sample, self.interval = sample, interval
        self.values: list[Any] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.values.append(self.sample())
            self.done.wait(self.interval)

    def stop(self) -> list[Any]:
        self.done.set()
        self.join(timeout=30)
        return self.values


async def closed_loop_capacity(address: str, requests: int = 40, concurrency: int = 4) -> float:
    """Requests per second the server answers with `concurrency` callers always waiting."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.ClassifierStub(channel)
        request = pb.ClassifyRequest(texts=TEXTS)
        await stub.Classify(request, timeout=60)  # connected and warm
        left = requests
        started = time.perf_counter()

        async def caller() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await stub.Classify(request, timeout=60)

        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return requests / (time.perf_counter() - started)


async def open_loop(address: str, model: str, rate: float, duration: float) -> dict[str, Any]:
    """Send at `rate` per second for `duration` seconds, whatever the answers; every 4th
    request through the Open Inference Protocol. Returns codes and latencies per code."""
    latencies: dict[str, list[float]] = {}
    infer = ipb.ModelInferRequest(model_name=model)
    infer.inputs.add(name="TEXT", datatype="BYTES", shape=[len(TEXTS)])
    infer.raw_input_contents.append(pack_bytes([t.encode() for t in TEXTS]))
    classify = pb.ClassifyRequest(texts=TEXTS)
    async with grpc.aio.insecure_channel(address) as channel:
        stub, oip = pb_grpc.ClassifierStub(channel), ipb_grpc.GRPCInferenceServiceStub(channel)

        async def one(index: int) -> None:
            started = time.perf_counter()
            try:
                if index % 4 == 3:
                    await oip.ModelInfer(infer, timeout=DEADLINE)
                else:
                    await stub.Classify(classify, timeout=DEADLINE)
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            latencies.setdefault(code, []).append(time.perf_counter() - started)

        tasks, sent, started = [], 0, time.monotonic()
        while (now := time.monotonic()) - started < duration:
            tasks.append(asyncio.create_task(one(sent)))
            sent += 1
            await asyncio.sleep(max(0.0, started + sent / rate - now))
        offered_for = time.monotonic() - started
        await asyncio.gather(*tasks)
    return {"sent": sent, "seconds": offered_for, "latencies": latencies}


def health_check(address: str) -> Any:
    def check() -> str:
        with grpc.insecure_channel(address) as channel:  # a fresh connection, as a probe makes
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=5
                )
            except grpc.RpcError as exc:
                return str(exc.code().name)
            return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    return check


def test_overload_is_refused_at_once_while_health_and_memory_hold(tiny_repository: Path) -> None:
    flags = ["--max-queue-size", str(QUEUE), "--max-batch-size", "16"]
    with serve_subprocess(tiny_repository, *flags) as proc:
        server = psutil.Process(proc.process.pid)
        capacity = asyncio.run(closed_loop_capacity(proc.address))
        baseline = server.memory_info().rss  # warm: loaded, batches run, buffers allocated
        with grpc.insecure_channel(proc.address) as channel:
            model = pb_grpc.ClassifierStub(channel).GetModel(pb.GetModelRequest()).name
        health = Sampler(health_check(proc.address), 0.05)
        memory = Sampler(lambda: server.memory_info().rss, 0.02)
        health.start()
        memory.start()
        try:
            load = asyncio.run(open_loop(proc.address, model, FACTOR * capacity, DURATION))
        finally:
            statuses, rss = health.stop(), memory.stop()
        with grpc.insecure_channel(proc.address) as channel:
            stub = pb_grpc.ClassifierStub(channel)
            assert len(stub.Classify(pb.ClassifyRequest(texts=TEXTS), timeout=60).results) == 16
            assert stub.GetModel(pb.GetModelRequest()).batching.queue_depth == 0
        assert proc.metrics_url is not None
        with urllib.request.urlopen(proc.metrics_url, timeout=10) as response:
            metrics = response.read().decode()

    latencies = load["latencies"]
    codes = Counter({code: len(values) for code, values in latencies.items()})
    rejected = sorted(latencies.get("RESOURCE_EXHAUSTED", []))
    handled = [  # (sum, count) of the server's own time on the requests it refused
        sum(float(value) for value in re.findall(pattern, metrics, re.M))
        for pattern in (
            rf'^textserve_request_duration_seconds_{part}{{code="RESOURCE_EXHAUSTED".*}} (\S+)$'
            for part in ("sum", "count")
        )
    ]
    print(
        f"\noverload: capacity {capacity:.0f} req/s (16 texts each); offered "
        f"{load['sent'] / load['seconds']:.0f} req/s ({FACTOR:g}x) for {load['seconds']:.1f}s: "
        f"{load['sent']} sent, {dict(codes)}; rejections: server-side mean "
        f"{1e3 * handled[0] / max(1, handled[1]):.2f} ms, at the client p50 "
        f"{1e3 * statistics.median(rejected or [0]):.1f} ms, max {1e3 * max(rejected or [0]):.1f}"
        f" ms; health {Counter(statuses)}; RSS {baseline / 2**20:.0f} -> max "
        f"{max(rss) / 2**20:.0f} MiB (bound {(baseline + RSS_HEADROOM) / 2**20:.0f})"
    )
    assert sum(codes.values()) == load["sent"]
    # Accepted requests are answered within their deadline; the rest are refused as overload
    # (a DEADLINE_EXCEEDED or UNAVAILABLE here would be a request the server let time out).
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
    assert codes["OK"] > 0 and codes["RESOURCE_EXHAUSTED"] > 0, codes
    assert statuses and set(statuses) == {"SERVING"}, Counter(statuses)
    assert max(rss) <= baseline + RSS_HEADROOM, (baseline, max(rss))


def test_a_full_queue_refuses_before_any_tokenizing(tiny_repository: Path) -> None:
    # "At once", by construction: a refused request costs no tokenizer time, so refusing excess
    # load does not eat the capacity serving the accepted requests.
    with running_server(tiny_repository, batcher=BatcherConfig(max_queue_size=4)) as srv:
        handle = srv.server.repository.get()
        real = handle.runner.tokenization.tokenizer
        seen: list[int] = []

        class Counting:
            def encode_batch(self, texts: list[str]) -> Any:
                seen.append(len(texts))
                return real.encode_batch(texts)

            def encode_batch_fast(self, texts: list[str]) -> Any:  # what serving calls
                seen.append(len(texts))
                return real.encode_batch_fast(texts)

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        with srv.channel() as channel:
            stub = pb_grpc.ClassifierStub(channel)
            oip = ipb_grpc.GRPCInferenceServiceStub(channel)
            srv.call(handle.batcher.pause)
            handle.runner.tokenization.tokenizer = Counting()  # type: ignore[assignment]
            try:
                held = stub.Classify.future(pb.ClassifyRequest(texts=TEXTS[:4]), timeout=60)
                while handle.stats().queue_depth < 4:
                    time.sleep(0.01)  # polling interval
                assert seen == []  # queued texts are tokenized in their batch, as it runs
                infer = ipb.ModelInferRequest(model_name=handle.name)
                infer.inputs.add(name="TEXT", datatype="BYTES", shape=[1])
                infer.raw_input_contents.append(pack_bytes([b"one more"]))
                for call, request in [
                    (stub.Classify, pb.ClassifyRequest(texts=["one more"])),
                    (oip.ModelInfer, infer),
                ]:
                    try:
                        call(request, timeout=60)
                        raise AssertionError("a full queue took a request")
                    except grpc.RpcError as exc:
                        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert seen == []  # neither refused request reached the tokenizer
            finally:
                srv.call(handle.batcher.resume)
            try:
                assert len(held.result().results) == 4
            finally:
                handle.runner.tokenization.tokenizer = real
            assert seen == [4]  # the queued request alone
