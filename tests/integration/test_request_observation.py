"""Both front ends observe requests through ONE helper (service/dataplane/observe.py): a request
whose deadline expires while its texts wait in the queue is counted as DEADLINE_EXCEEDED in
textserve_request_duration_seconds, through textserve.v1 and through the Open Inference
Protocol alike (the OIP servicer's own copy once counted it as CANCELLED)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.handmade import make_version
from tests.serving import RunningServer, running_server
from textserve.oip import grpc_service_pb2 as oip
from textserve.oip import grpc_service_pb2_grpc as oip_grpc
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

MODEL = "handmade"


def classify(channel: grpc.Channel, timeout: float) -> grpc.Future:
    stub = pb_grpc.ClassifierStub(channel)
    return stub.Classify.future(pb.ClassifyRequest(texts=["a good film"]), timeout=timeout)


def model_infer(channel: grpc.Channel, timeout: float) -> grpc.Future:
    request = oip.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(b"a good film")
    return oip_grpc.GRPCInferenceServiceStub(channel).ModelInfer.future(request, timeout=timeout)


def observed(srv: RunningServer, method: str, code: str) -> float:
    value = srv.metrics.registry.get_sample_value(
        "textserve_request_duration_seconds_count",
        {"method": method, "model": MODEL, "code": code},
    )
    return value or 0.0


@pytest.mark.parametrize("core_deadline", [True, False], ids=["queue-drops", "grpc-cancels"])
@pytest.mark.parametrize(("method", "send"), [("Classify", classify), ("ModelInfer", model_infer)])
def test_a_deadline_expiring_in_the_queue_is_counted_deadline_exceeded(
    tmp_path: Path,
    method: str,
    send: Callable[[grpc.Channel, float], grpc.Future],
    core_deadline: bool,
) -> None:
    """Two ways out of the queue race at the deadline: the batcher fails the request with
    DeadlineExceededError, or grpc cancels the handler. With the batcher's deadline switched
    off ("grpc-cancels") the cancellation is the only way, and it must still count as
    DEADLINE_EXCEEDED, not CANCELLED."""
    make_version(tmp_path, MODEL, 1)
    with running_server(tmp_path) as srv:
        handle = srv.server.repository.get()
        channel = srv.channel()
        if not core_deadline:
            submit = handle.batcher.submit

            async def without_deadline(
                *args: Any, deadline: float | None = None, **options: Any
            ) -> Any:
                return await submit(*args, **options)

            handle.batcher.submit = without_deadline  # type: ignore[method-assign]
        srv.call(handle.batcher.pause)  # the texts wait in the queue until the deadline passes
        try:
            with pytest.raises(grpc.RpcError) as info:
                send(channel, 0.5).result()
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            # The server observes the request when grpc cancels its handler, at the server's
            # own deadline: poll for it (no fixed sleep), up to a generous limit.
            for _ in range(500):
                if observed(srv, method, "DEADLINE_EXCEEDED"):
                    break
                time.sleep(0.01)
        finally:
            srv.call(handle.batcher.resume)
        assert observed(srv, method, "DEADLINE_EXCEEDED") == 1
        assert observed(srv, method, "CANCELLED") == 0
        assert send(channel, 10.0).result()  # and the model serves on


@pytest.mark.parametrize(("method", "send"), [("Classify", classify), ("ModelInfer", model_infer)])
def test_the_request_duration_holds_the_whole_request_queue_included(
    tmp_path: Path, method: str, send: Callable[[grpc.Channel, float], grpc.Future]
) -> None:
    """textserve_request_duration_seconds measures a request from its arrival to its answer,
    not its inference alone: a request held 0.4 s in the queue takes at least 0.4 s there."""
    make_version(tmp_path, MODEL, 1)
    with running_server(tmp_path) as srv, srv.channel() as channel:
        handle = srv.server.repository.get()
        srv.call(handle.batcher.pause)
        try:
            answer = send(channel, 60.0)
            deadline = time.monotonic() + 30
            while handle.stats().queue_depth < 1 and time.monotonic() < deadline:
                time.sleep(0.01)  # polling, not a readiness guess
            time.sleep(0.4)  # the queue time being measured
        finally:
            srv.call(handle.batcher.resume)
        answer.result()
        labels = {"method": method, "model": MODEL, "code": "OK"}
        registry = srv.metrics.registry
        assert registry.get_sample_value("textserve_request_duration_seconds_count", labels) == 1
        total = registry.get_sample_value("textserve_request_duration_seconds_sum", labels)
        assert total is not None and total >= 0.4
