"""Faults on a real server: an inference failure inside one batch (injected through the runtime
interface) fails that batch only; callers that cancel or vanish leave no queue slot behind;
SIGTERM under open-loop load loses no accepted request; a second signal during the drain
forces a prompt, non-zero exit. (SIGTERM with a full queue: tests/integration/
test_server_lifecycle.py::test_sigterm_with_100_requests_in_flight_loses_none.)"""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from tests.handmade import WORDS, make_tokenizer, make_version
from tests.serving import (
    ROOT,
    RunningServer,
    poll,
    running_server,
    serve_subprocess,
)
from textserve.bench.process import spawn
from textserve.oip import grpc_service_pb2 as ipb
from textserve.oip import grpc_service_pb2_grpc as ipb_grpc
from textserve.service.config import BatcherConfig
from textserve.service.dataplane.oip_codec import pack_bytes
from textserve.tokenization import Tokenization
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

TEXT = "a gripping, beautifully acted film"


class FailingSession:
    """The runtime interface (textserve.service.engine.runtime.Session) around the real session,
    failing the runs whose 1-based numbers are in `fail`, as a GPU fault or a corrupt input
    would."""

    def __init__(self, real: Any, fail: set[int]) -> None:
        self._real = real
        self._fail = fail
        self.runs = 0

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        self.runs += 1
        if self.runs in self._fail:
            raise RuntimeError("injected fault: CUDA error an illegal memory access (secret)")
        return np.asarray(self._real.run(input_ids, attention_mask))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def infer_request(model: str, texts: list[str]) -> ipb.ModelInferRequest:
    request = ipb.ModelInferRequest(model_name=model)
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[len(texts)])
    request.raw_input_contents.append(pack_bytes([t.encode() for t in texts]))
    return request


def outcome(future: Any) -> tuple[grpc.StatusCode, str]:
    try:
        future.result()
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def test_a_text_the_model_cannot_take_fails_only_its_request(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)
    config = BatcherConfig(max_batch_size=8, max_queue_delay=0.001)
    with running_server(tmp_path, batcher=config) as srv, srv.channel() as channel:
        handle = srv.server.repository.get()
        stub = pb_grpc.ClassifierStub(channel)
        oip = ipb_grpc.GRPCInferenceServiceStub(channel)
        # A tokenizer with one word more than the model's embedding has rows (the load-time
        # check refuses such a version; this one slipped past it): onnxruntime fails on "zebra".
        real = handle.runner.tokenization
        handle.runner.tokenization = Tokenization(
            make_tokenizer([*WORDS, "zebra"]), handle.max_length
        )
        srv.call(handle.batcher.pause)
        try:
            # All in the queue before the batcher runs: one batch of 5 texts.
            good = stub.Classify.future(pb.ClassifyRequest(texts=["good film", "bad"]), timeout=60)
            poll(lambda: handle.stats().queue_depth == 2, "2 queued texts")
            bad = oip.ModelInfer.future(infer_request("m", ["a film", "a zebra film"]), timeout=60)
            poll(lambda: handle.stats().queue_depth == 4, "4 queued texts")
            other = stub.Classify.future(pb.ClassifyRequest(texts=["the plot"]), timeout=60)
            poll(lambda: handle.stats().queue_depth == 5, "5 queued texts")
            srv.call(handle.batcher.resume)
            results = [outcome(f) for f in (good, bad, other)]
            alone = outcome(stub.Classify.future(pb.ClassifyRequest(texts=["zebra"]), timeout=60))
        finally:
            srv.call(handle.batcher.resume)
            handle.runner.tokenization = real
        assert [code for code, _ in results] == [
            grpc.StatusCode.OK,
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.OK,
        ]
        assert len(good.result().results) == 2 and len(other.result().results) == 1
        assert "texts[1]: model 'm' version 1 cannot take this text" in results[1][1]
        # A batch of one unusable text is the text's fault too: the model runs others.
        assert alone[0] == grpc.StatusCode.INVALID_ARGUMENT and "texts[0]" in alone[1]
    failures = srv.metrics.registry.get_sample_value
    labels = {"method": "ModelInfer", "model": "m", "reason": "invalid_argument"}
    assert failures("textserve_request_failures_total", labels) == 1
    labels = {"method": "Classify", "model": "m", "reason": "internal"}
    assert not failures("textserve_request_failures_total", labels)


def test_an_inference_failure_fails_only_its_batch(tiny_repository: Path) -> None:
    config = BatcherConfig(max_batch_size=4, max_queue_delay=0.001)
    with running_server(tiny_repository, batcher=config) as srv, srv.channel() as channel:
        handle = srv.server.repository.get()
        # A fault that lasts through the first batch: its run, the 6 runs that look for the
        # texts to blame (halves, then single texts), and the one-[UNK] probe that finds the
        # model itself failing. A fault that goes away meanwhile fails no request.
        session = FailingSession(handle.runner.session, fail=set(range(1, 9)))
        stub = pb_grpc.ClassifierStub(channel)
        oip = ipb_grpc.GRPCInferenceServiceStub(channel)
        srv.call(handle.batcher.pause)
        handle.runner.session = session  # type: ignore[assignment]
        try:
            # Same texts, same length bucket: FIFO, so the first batch (4 texts) holds exactly
            # the Classify and the ModelInfer request, the second the last request.
            first = stub.Classify.future(pb.ClassifyRequest(texts=[TEXT, TEXT]), timeout=60)
            poll(lambda: handle.stats().queue_depth == 2, "2 queued texts")
            second = oip.ModelInfer.future(infer_request(handle.name, [TEXT, TEXT]), timeout=60)
            poll(lambda: handle.stats().queue_depth == 4, "4 queued texts")
            third = stub.Classify.future(pb.ClassifyRequest(texts=[TEXT, TEXT]), timeout=60)
            poll(lambda: handle.stats().queue_depth == 6, "6 queued texts")
            srv.call(handle.batcher.resume)
            results = [outcome(f) for f in (first, second, third)]
        finally:
            srv.call(handle.batcher.resume)
            handle.runner.session = session._real
        assert [code for code, _ in results] == [
            grpc.StatusCode.INTERNAL,
            grpc.StatusCode.INTERNAL,
            grpc.StatusCode.OK,
        ]
        for _, message in results[:2]:
            assert "inference failed" in message and "secret" not in message  # no internals
        assert session.runs == 9
        after = stub.Classify(pb.ClassifyRequest(texts=[TEXT, "a dull plot"]), timeout=60)
        assert len(after.results) == 2  # the server goes on
    failures = srv.metrics.registry.get_sample_value
    for method in ("Classify", "ModelInfer"):
        labels = {"method": method, "model": handle.name, "reason": "internal"}
        assert failures("textserve_request_failures_total", labels) == 1


def queue_depth(srv: RunningServer, model: str) -> float | None:
    return srv.metrics.registry.get_sample_value("textserve_queue_depth", {"model": model})


def cancelled_requests(srv: RunningServer, model: str) -> float:
    labels = {"method": "Classify", "model": model, "reason": "cancelled"}
    return srv.metrics.registry.get_sample_value("textserve_request_failures_total", labels) or 0


# A client that sends one request of 4 texts and waits; the test kills it mid-request.
VANISHING_CLIENT = """
import sys, grpc
from textserve.v1 import classifier_pb2 as pb, classifier_pb2_grpc as pb_grpc
channel = grpc.insecure_channel(sys.argv[1])
print("sending", flush=True)
pb_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=["held"] * 4), timeout=120)
"""


@pytest.mark.parametrize("how", ["cancel", "vanish"])
def test_callers_that_cancel_or_vanish_leave_no_queue_slot(tiny_repository: Path, how: str) -> None:
    config = BatcherConfig(max_queue_size=4)
    with running_server(tiny_repository, batcher=config) as srv, srv.channel() as channel:
        handle = srv.server.repository.get()
        stub = pb_grpc.ClassifierStub(channel)
        before = handle.stats()
        srv.call(handle.batcher.pause)
        try:
            if how == "cancel":
                held = stub.Classify.future(pb.ClassifyRequest(texts=["held"] * 4), timeout=120)
                poll(lambda: queue_depth(srv, handle.name) == 4, "the queue to fill")
                held.cancel()
            else:
                client = subprocess.Popen(
                    [sys.executable, "-c", VANISHING_CLIENT, srv.address],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                poll(lambda: queue_depth(srv, handle.name) == 4, "the queue to fill")
                client.kill()  # SIGKILL: the connection drops with no goodbye
                client.communicate(timeout=30)
            poll(lambda: cancelled_requests(srv, handle.name) == 1, "the server to see it")
            full = stub.Classify.future(pb.ClassifyRequest(texts=["more"]), timeout=60)
            assert outcome(full)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED  # still held: paused
        finally:
            srv.call(handle.batcher.resume)
        poll(lambda: queue_depth(srv, handle.name) == 0, "queue depth 0")
        after = handle.stats()
        assert after.items == before.items  # nothing of the dead request reached the model
        assert after.dropped_cancelled - before.dropped_cancelled == 4
        # every slot is free again: a request the size of the whole queue fits
        response = stub.Classify(pb.ClassifyRequest(texts=["again"] * 4), timeout=60)
        assert len(response.results) == 4


# -- signals under load (textserve serve as a child process) -------------------------------------


class OpenLoop:
    """Classify requests at a fixed rate from a background event loop, whatever the answers."""

    def __init__(self, address: str, rate: float, texts: int = 4) -> None:
        self.address, self.rate, self.texts = address, rate, texts
        self.codes: Counter[str] = Counter()
        self.stop = threading.Event()
        self.sent = 0
        self.in_flight = 0
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> OpenLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(timeout=120)

    async def _one(self, stub: Any, index: int) -> None:
        request = pb.ClassifyRequest(id=str(index), texts=[f"film {index}"] * self.texts)
        self.in_flight += 1
        try:
            await stub.Classify(request, timeout=60)
            self.codes["OK"] += 1
        except grpc.RpcError as exc:
            self.codes[exc.code().name] += 1
        finally:
            self.in_flight -= 1

    async def _main(self) -> None:
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = pb_grpc.ClassifierStub(channel)
            tasks = []
            started = time.monotonic()
            while not self.stop.is_set():
                tasks.append(asyncio.create_task(self._one(stub, self.sent)))
                self.sent += 1
                # open loop: the schedule, not the answers, decides when the next one goes
                await asyncio.sleep(max(0.0, started + self.sent / self.rate - time.monotonic()))
            await asyncio.gather(*tasks)


# `textserve serve`'s own serve() (signal handling included) in a child process that prints, once
# the server has stopped, how many requests the server handled and how many of them failed.
SERVE_AND_COUNT = """
import asyncio, json, logging, sys
from pathlib import Path
from textserve.cli import build_parser
from textserve.service.cli import build_config, write_ready_file
from textserve.service.server import serve
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s: %(message)s")
args = build_parser().parse_args(sys.argv[1:])
servers = []
def ready(server):
    servers.append(server)
    write_ready_file(Path(args.ready_file), server.address, None, 1)
status = asyncio.run(serve(build_config(args), ready))
counts = {"textserve_requests_total": 0.0, "textserve_request_failures_total": 0.0}
for metric in servers[0].metrics.registry.collect():
    for sample in metric.samples:
        if sample.name in counts:
            counts[sample.name] += sample.value
print("COUNTS " + json.dumps(counts), flush=True)
sys.exit(status)
"""


def test_sigterm_under_load_loses_no_accepted_request(tiny_repository: Path) -> None:
    # Batches wait up to 50 ms to fill: a dozen requests are queued or running at any moment.
    argv = ["serve", "--repository", str(tiny_repository), "--listen", "127.0.0.1:0",
            "--metrics-port", "off", "--intra-op-threads", "1", "--max-queue-delay-ms", "50",
            "--grace-period", "60"]  # fmt: skip
    with spawn([sys.executable, "-c", SERVE_AND_COUNT, *argv], cwd=ROOT) as server:
        with OpenLoop(server.address, rate=200) as load:
            poll(lambda: load.codes["OK"] >= 50, "50 answered requests")
            server.process.send_signal(signal.SIGTERM)
            sent_at_signal, in_flight = load.sent, load.in_flight
            poll(lambda: load.sent >= sent_at_signal + 100, "100 more requests sent")
        status = server.process.wait(timeout=60)
    lines = server.output
    log = "".join(lines)
    assert status == 0, log
    (counts_line,) = [x for x in lines if x.startswith("COUNTS ")]
    counts = json.loads(counts_line.removeprefix("COUNTS "))
    codes = dict(load.codes)
    print(
        f"\nSIGTERM under load: {load.sent} sent ({sent_at_signal} before SIGTERM, {in_flight} "
        f"of them in flight): {codes}; the server handled "
        f"{counts['textserve_requests_total']:.0f}, failed "
        f"{counts['textserve_request_failures_total']:.0f}"
    )
    assert sum(codes.values()) == load.sent
    # Every request the server accepted (its handler ran) was answered, and answered OK ...
    assert counts["textserve_request_failures_total"] == 0, log
    assert counts["textserve_requests_total"] == codes["OK"], (counts, codes)
    # ... so the others never got in: UNAVAILABLE once the port had closed (the drain's gate
    # holds the calls that come while it starts, then serves them: service/drain.py); never
    # CANCELLED, which the standard retry policies would not send again (grpc's stop() cancels
    # the calls it has not handed to a handler yet: the gate lets the server take them first).
    assert set(codes) <= {"OK", "UNAVAILABLE"}, codes
    assert codes.get("UNAVAILABLE", 0) > 0, codes  # the load went on past the SIGTERM
    assert "SIGTERM received: draining" in log and "left after the grace period" not in log


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_during_the_drain_forces_exit(
    tiny_repository: Path, second: signal.Signals
) -> None:
    # A bidirectional stream the client keeps open holds the drain for the whole grace period
    # (600 s): only the forced exit can end the process within the wait below.
    with (
        serve_subprocess(tiny_repository, "--grace-period", "600") as proc,
        grpc.insecure_channel(proc.address) as channel,
    ):
        outbox: queue.Queue[pb.ClassifyRequest | None] = queue.Queue()

        def requests() -> Iterator[pb.ClassifyRequest]:
            while (item := outbox.get()) is not None:
                yield item

        stream = pb_grpc.ClassifierStub(channel).ClassifyStream(requests(), timeout=600)
        outbox.put(pb.ClassifyRequest(id="1", texts=[TEXT]))
        assert next(stream).id == "1"
        proc.process.send_signal(signal.SIGTERM)
        poll(lambda: "SIGTERM received: draining" in proc.text(), "the drain to start")
        proc.process.send_signal(second)
        status = proc.process.wait(timeout=60)
        outbox.put(None)
        with pytest.raises(grpc.RpcError):
            next(stream)  # the held call was cut, not left hanging
    assert status == 128 + second
    assert f"second {second.name}: stopping without grace" in proc.text()
