"""/healthz and /readyz on the metrics port follow the server's grpc.health.v1 state through
warm-up, drain and model loss, read with a real HTTP client (requests), beside the gRPC
health service they must agree with."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.handmade import make_version
from tests.serving import RunningServer, health, running_server
from textserve.client import Client
from textserve.service.repository.core import ModelRepository

MODEL = "handmade"
DEADLINE = 60.0  # the most any state change may take; normally well under a second


def wait_for(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + DEADLINE
    while not (result := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)  # polling, not a readiness guess
    return result


def http(srv: RunningServer, path: str) -> tuple[int, str]:
    response = requests.get(f"http://127.0.0.1:{srv.server.metrics_port}{path}", timeout=10)
    return response.status_code, response.text.strip()


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    make_version(tmp_path / "models", MODEL, 1)
    return tmp_path / "models"


def test_readyz_is_503_while_warming_then_200_with_grpc_health(
    repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loading = threading.Event()
    release = threading.Event()
    load_all = ModelRepository.load_all

    async def slow_load_all(self: ModelRepository) -> None:
        loading.set()
        await asyncio.to_thread(release.wait, DEADLINE)  # warm-up held until the test says
        await load_all(self)

    monkeypatch.setattr(ModelRepository, "load_all", slow_load_all)
    with running_server(repository, metrics_port=0, metrics_host="127.0.0.1", wait=False) as srv:
        wait_for(loading.is_set, "the model load to start")
        assert srv.server.metrics_port
        assert http(srv, "/readyz") == (503, "warming")
        assert http(srv, "/healthz") == (200, "ok")
        assert health(srv.address) == "NOT_SERVING"
        release.set()
        wait_for(lambda: health(srv.address) == "SERVING", "grpc health SERVING")
        assert http(srv, "/readyz") == (200, "serving")
        assert http(srv, "/healthz") == (200, "ok")
        assert http(srv, "/metrics")[0] == 200  # the registry is still served beside them


def test_readyz_is_503_while_draining_and_healthz_stays_200(repository: Path) -> None:
    with running_server(repository, metrics_port=0, metrics_host="127.0.0.1") as srv:
        assert http(srv, "/readyz") == (200, "serving")
        handle = srv.server.repository.get(None, None)
        gate = threading.Event()
        run_batch = handle.batcher.run_batch

        def held(payloads: Any) -> Any:  # the model run waits: a request stays in flight
            gate.wait(DEADLINE)
            return run_batch(payloads)

        handle.batcher.run_batch = held
        inflight = {"model": MODEL}
        with Client(srv.address, timeout=30) as client, ThreadPoolExecutor(1) as pool:
            pending = pool.submit(client.classify, ["a request in flight during the drain"])
            wait_for(
                lambda: (
                    srv.metrics.registry.get_sample_value("textserve_inflight_texts", inflight) == 1
                ),
                "the request to be in flight",
            )
            stopping = srv.run_in_background(srv.server.stop(grace=30))
            wait_for(lambda: http(srv, "/readyz") == (503, "draining"), "/readyz draining")
            assert http(srv, "/healthz") == (200, "ok")  # draining is alive: no restart
            # gRPC refuses new calls once draining: the grpc probe fails too
            assert health(srv.address) in ("NOT_SERVING", "UNAVAILABLE")
            gate.set()
            assert len(pending.result(timeout=DEADLINE).predictions) == 1
            stopping.result(timeout=DEADLINE)


def test_readyz_follows_model_loss_and_return(repository: Path, tmp_path: Path) -> None:
    with running_server(
        repository, metrics_port=0, metrics_host="127.0.0.1", poll_interval=0.1
    ) as srv:
        assert http(srv, "/readyz") == (200, "serving")
        version = repository / MODEL / "1"
        kept = tmp_path / "kept"
        shutil.move(version, kept)  # the only version disappears: no model to serve
        wait_for(lambda: http(srv, "/readyz") == (503, "no model"), "/readyz no model")
        assert http(srv, "/healthz") == (200, "ok")
        assert health(srv.address) == "NOT_SERVING"
        shutil.move(kept, version)
        wait_for(lambda: http(srv, "/readyz") == (200, "serving"), "/readyz serving again")
        assert health(srv.address) == "SERVING"


def test_metrics_has_the_scaling_signal_at_zero_when_idle(repository: Path) -> None:
    with running_server(repository, metrics_port=0, metrics_host="127.0.0.1") as srv:
        status, body = http(srv, "/metrics")
        assert status == 200
        assert f'textserve_inflight_texts{{model="{MODEL}"}} 0.0' in body
