"""The door on a running server (service/door.py, issue 39): under overload - requests arriving
faster than the server has ever answered them, more in flight than it answers in
--inflight-wait-ms for a second - the next ones are refused at once, RESOURCE_EXHAUSTED over
gRPC and 429 with Retry-After over HTTP, in each API's own shape, counted, and the door opens
again once the overload is over. The judgement itself, with numbers: tests/unit/service/
test_door.py."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import requests

from tests.serving import poll, running_server
from textserve.service.door import FLOOR
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

TEXT = "a quiet film"


def test_overload_is_refused_at_the_door_then_let_in_again(tiny_repository: Path) -> None:
    with running_server(tiny_repository, metrics_port=0, inflight_wait=0.05) as srv:
        handle = srv.server.repository.get()
        registry = srv.metrics.registry
        url = f"http://127.0.0.1:{srv.server.metrics_port}"
        with srv.channel() as channel:
            stub = pb_grpc.ClassifierStub(channel)
            srv.call(handle.batcher.pause)  # nothing is answered: every arrival is overload
            held: list[grpc.Future] = []
            refused: grpc.RpcError | None = None
            over_http = None
            try:
                deadline = time.monotonic() + 60
                while refused is None and time.monotonic() < deadline:
                    held.append(stub.Classify.future(pb.ClassifyRequest(texts=[TEXT]), timeout=90))
                    time.sleep(0.02)  # 50 calls a second: past FLOOR in flight within a second
                    for call in held:
                        if call.done() and call.exception() is not None:
                            refused = call.exception()  # type: ignore[assignment]
                            over_http = requests.post(
                                f"{url}/v1/classify", json={"texts": [TEXT]}, timeout=30
                            )
                            break
                limit = registry.get_sample_value("textserve_inflight_limit")
            finally:
                srv.call(handle.batcher.resume)
            assert refused is not None, "no call was refused"
            assert refused.code() is grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
            assert "--inflight-wait-ms" in refused.details()  # type: ignore[attr-defined]
            assert limit == FLOOR  # nothing answered: the least the door lets in
            assert over_http is not None and over_http.status_code == 429, over_http
            assert over_http.headers["retry-after"] == "1"
            assert over_http.json()["code"] == "RESOURCE_EXHAUSTED"
            assert "--inflight-wait-ms" in over_http.json()["error"]
            # the calls let in are answered, none lost
            let_in = [call for call in held if call.exception() is None]
            assert len(let_in) >= FLOOR
            assert all(len(call.result().results) == 1 for call in let_in)
            for method in ("Classify", "HttpClassify"):
                counted = registry.get_sample_value(
                    "textserve_request_limit_refusals_total",
                    {"method": method, "limit": "inflight_wait"},
                )
                assert counted is not None and counted >= 1, method
            # arrivals fall back: the count alone again, and a call is answered
            poll(
                lambda: registry.get_sample_value("textserve_inflight_limit") == 512,
                "the door open again",
            )
            assert len(stub.Classify(pb.ClassifyRequest(texts=[TEXT]), timeout=30).results) == 1


def test_off_leaves_the_count_alone(tiny_repository: Path) -> None:
    with running_server(tiny_repository, inflight_wait=None, max_concurrent_rpcs=64) as srv:
        door = srv.server.ctx.door
        assert door is not None and door.wait is None and door.limit == 64
        assert srv.metrics.registry.get_sample_value("textserve_inflight_limit") == 64
