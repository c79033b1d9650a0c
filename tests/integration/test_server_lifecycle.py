"""The server's lifecycle for real: SERVING only after warm-up, NOT_SERVING on drain, SIGTERM with
requests in flight loses none, SIGINT, startup errors, reflection, the metrics endpoint."""

from __future__ import annotations

import re
import signal
import threading
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.serving import health, poll, running_server, serve_subprocess
from textserve.cli import main as cli_main
from textserve.service.engine.handle import ModelHandle
from textserve.service.engine.runtime import CUDA, available_providers
from textserve.service.health import NOT_SERVING, SERVING
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc


def test_health_is_serving_only_after_warmup(
    tiny_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warming, release, warmed = threading.Event(), threading.Event(), threading.Event()
    real_warmup = ModelHandle.warmup

    def gated_warmup(self: ModelHandle) -> None:
        warming.set()
        release.wait(60)
        real_warmup(self)
        warmed.set()

    monkeypatch.setattr(ModelHandle, "warmup", gated_warmup)
    with running_server(tiny_repository, wait=False) as srv:
        poll(warming.is_set, "warm-up to start")
        service = pb.DESCRIPTOR.services_by_name["Classifier"].full_name
        assert health(srv.address) == "NOT_SERVING"
        assert health(srv.address, service) == "NOT_SERVING"
        release.set()
        poll(lambda: health(srv.address) == "SERVING", "SERVING")
        assert warmed.is_set()
        assert health(srv.address, service) == "SERVING"


def test_drain_reports_not_serving_and_finishes_in_flight_work(tiny_repository: Path) -> None:
    with running_server(tiny_repository, grace=10) as srv:
        handle = srv.server.repository.get()
        gate, running = threading.Event(), threading.Event()
        session = handle.runner.session
        real_run = session.run

        def held_run(*args: object) -> object:
            running.set()
            gate.wait(60)
            return real_run(*args)  # type: ignore[arg-type]

        session.run = held_run  # type: ignore[method-assign]
        with srv.channel() as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            assert next(watch).status == SERVING
            stub = pb_grpc.ClassifierStub(channel)
            in_flight = stub.Classify.future(pb.ClassifyRequest(texts=["held"]), timeout=60)
            # (an empty queue would not do: it is empty before the request arrives, too)
            poll(running.is_set, "the batch to start")
            stopping = srv.run_in_background(srv.server.stop(10))
            assert next(watch).status == NOT_SERVING
            watch.cancel()
            gate.set()
            assert len(in_flight.result().results) == 1  # finished, not cut off
            stopping.result(timeout=30)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_sigterm_with_100_requests_in_flight_loses_none(tiny_repository: Path) -> None:
    # Requests wait in the queue (batches of up to 128, 10 s delay) until SIGTERM's drain runs
    # them at once; a grace period shorter than the delay proves the drain did not just wait.
    args = ["--max-batch-size", "128", "--max-queue-delay-ms", "10000", "--grace-period", "5"]
    with serve_subprocess(tiny_repository, *args) as proc:
        assert proc.metrics_url is not None
        with grpc.insecure_channel(proc.address) as channel:
            stub = pb_grpc.ClassifierStub(channel)
            futures = [
                stub.Classify.future(pb.ClassifyRequest(id=str(i), texts=[f"film {i}"]), timeout=60)
                for i in range(100)
            ]

            def queued() -> bool:
                match = re.search(
                    r"^textserve_queue_depth\{[^}]*\} (\S+)$", scrape(proc.metrics_url or ""), re.M
                )
                return match is not None and float(match.group(1)) == 100

            poll(queued, "100 requests in the queue")
            proc.process.send_signal(signal.SIGTERM)
            responses = [f.result() for f in futures]
        assert sorted(int(r.id) for r in responses) == list(range(100))
        assert all(len(r.results) == 1 for r in responses)
        assert proc.process.wait(timeout=60) == 0
    assert "SIGTERM received: draining" in proc.text()


def test_sigint_stops_an_idle_server_with_status_0(tiny_repository: Path) -> None:
    with serve_subprocess(tiny_repository, "--metrics-port", "off") as proc:
        proc.process.send_signal(signal.SIGINT)
        assert proc.process.wait(timeout=60) == 0
    assert "SIGINT received: draining" in proc.text()


def test_device_cuda_without_cuda_is_a_startup_error(
    tiny_repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if CUDA in available_providers():
        pytest.skip("this machine's onnxruntime offers CUDA")
    argv = ["serve", "--repository", str(tiny_repository), "--device", "cuda",
            "--listen", "127.0.0.1:0", "--metrics-port", "off"]  # fmt: skip
    assert cli_main(argv) == 2
    assert (
        "--device cuda: this onnxruntime offers no CUDA execution provider"
        in capsys.readouterr().err
    )


def test_an_empty_repository_is_a_startup_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "serve",
        "--repository",
        str(tmp_path),
        "--listen",
        "127.0.0.1:0",
        "--metrics-port",
        "off",
    ]
    assert cli_main(argv) == 2
    assert "no model versions in" in capsys.readouterr().err


def test_reflection_lists_the_services(tiny_repository: Path) -> None:
    with running_server(tiny_repository) as srv, srv.channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (response,) = list(stub.ServerReflectionInfo(iter([request])))
        names = {s.name for s in response.list_services_response.service}
    assert {"textserve.v1.Classifier", "grpc.health.v1.Health"} <= names


def test_metrics_endpoint_counts_requests(tiny_repository: Path) -> None:
    with running_server(tiny_repository, metrics_port=0) as srv, srv.channel() as channel:
        stub = pb_grpc.ClassifierStub(channel)
        stub.Classify(pb.ClassifyRequest(texts=["one", "two"]))
        with pytest.raises(grpc.RpcError):
            stub.Classify(pb.ClassifyRequest(texts=[""]))
        text = scrape(f"http://127.0.0.1:{srv.server.metrics_port}/metrics")
        version = str(srv.server.repository.get().version)
    model = srv.server.repository.default_model
    assert f'textserve_requests_total{{method="Classify",model="{model}"}} 2.0' in text
    assert (
        f'textserve_request_failures_total{{method="Classify",model="{model}",'
        'reason="invalid_argument"} 1.0'
    ) in text
    labels = {"model": model, "version": version, "provider": "CPUExecutionProvider"}
    labels["precision"] = "fp32"
    assert srv.metrics.registry.get_sample_value("textserve_model_info", labels) == 1
    assert "textserve_model_info{" in text


def test_an_open_health_watch_does_not_hold_shutdown(tiny_repository: Path) -> None:
    # A load balancer watching health: on drain it hears NOT_SERVING, then its stream ends, so
    # stop() does not wait out the grace period (60 s here) for it.
    with running_server(tiny_repository, grace=60) as srv, srv.channel() as channel:
        health = health_pb2_grpc.HealthStub(channel)
        watch = health.Watch(health_pb2.HealthCheckRequest())
        unknown = health.Watch(health_pb2.HealthCheckRequest(service="no.such.Service"))
        assert next(watch).status == SERVING
        assert next(unknown).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        stopping = srv.run_in_background(srv.server.stop(60))
        assert [r.status for r in watch] == [NOT_SERVING]  # then the stream ends
        assert list(unknown) == []  # ended without a status change to report
        stopping.result(timeout=30)  # not 60: nothing was left in flight
