"""How many workers, each one's config, the reserved port, and the multiprocess metrics,
without starting workers (tests/integration/test_workers.py starts them)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, values

from tests.handmade import make_version
from textserve.service.config import RuntimeConfig, ServerConfig
from textserve.service.metrics import Metrics
from textserve.service.workers import sizing
from textserve.service.workers.errors import SupervisorError
from textserve.service.workers.metrics import server_registry
from textserve.service.workers.sizing import (
    MODEL_BYTES_FACTOR,
    WORKER_BASE_BYTES,
    resolve_workers,
    worker_config,
    worker_memory,
)
from textserve.service.workers.supervisor import reserve_port


@pytest.fixture
def config(tmp_path: Path) -> ServerConfig:
    make_version(tmp_path / "models", "m", 1)
    make_version(tmp_path / "models", "m", 2)
    return ServerConfig(repository=tmp_path / "models", runtime=RuntimeConfig(device="cpu"))


def machine(monkeypatch: pytest.MonkeyPatch, cpus: int, memory: int | None) -> None:
    monkeypatch.setattr(sizing, "cpu_limit", lambda: cpus)
    monkeypatch.setattr(sizing, "available_memory", lambda: memory)


def test_worker_memory_counts_the_newest_version_of_each_model(config: ServerConfig) -> None:
    newest = config.repository / "m" / "2" / "model.onnx"
    expected = WORKER_BASE_BYTES + MODEL_BYTES_FACTOR * newest.stat().st_size
    assert worker_memory(config.repository) == expected


@pytest.mark.parametrize(
    ("cpus", "expected"), [(1, 1), (2, 2), (3, 3), (4, 4), (8, 8), (16, 8), (64, 8)]
)
def test_auto_is_one_worker_per_cpu_up_to_8(
    monkeypatch: pytest.MonkeyPatch, config: ServerConfig, cpus: int, expected: int
) -> None:
    machine(monkeypatch, cpus, 2**40)
    assert resolve_workers("auto", config) == expected
    assert resolve_workers(" AUTO ", config) == expected


def test_auto_with_cuda_is_at_most_4(monkeypatch: pytest.MonkeyPatch, config: ServerConfig) -> None:
    machine(monkeypatch, 16, 2**40)
    monkeypatch.setattr(sizing, "uses_gpu", lambda device: True)
    assert resolve_workers("auto", config) == 4


def test_auto_never_takes_more_than_the_memory_holds(
    monkeypatch: pytest.MonkeyPatch, config: ServerConfig
) -> None:
    per_worker = worker_memory(config.repository)
    machine(monkeypatch, 16, 3 * per_worker + 1)
    assert resolve_workers("auto", config) == 3
    machine(monkeypatch, 16, per_worker // 2)
    assert resolve_workers("auto", config) == 1  # one always runs: as without --workers


def test_explicit_counts_and_their_errors(
    monkeypatch: pytest.MonkeyPatch, config: ServerConfig
) -> None:
    per_worker = worker_memory(config.repository)
    machine(monkeypatch, 2, 4 * per_worker)
    assert resolve_workers("3", config) == 3  # more than the CPUs is allowed
    assert resolve_workers("4", config) == 4
    with pytest.raises(SupervisorError, match=r"--workers 5 needs about .* use at most 4$"):
        resolve_workers("5", config)
    for bad in ("0", "-1"):
        with pytest.raises(SupervisorError, match="at least 1"):
            resolve_workers(bad, config)
    for bad in ("", "x", "2.0", "1e3"):
        with pytest.raises(SupervisorError, match="whole number"):
            resolve_workers(bad, config)
    machine(monkeypatch, 2, per_worker // 2)
    assert resolve_workers("1", config) == 1  # one process is never refused for memory


def test_each_worker_gets_its_share_of_the_cpus(
    monkeypatch: pytest.MonkeyPatch, config: ServerConfig
) -> None:
    monkeypatch.setattr(sizing, "cpu_limit", lambda: 8)
    worker = worker_config(config, 4321, 3)
    assert worker.listen == "127.0.0.1:4321"
    assert worker.metrics_port is None  # the supervisor serves /metrics
    assert worker.runtime.intra_op_threads == 2
    assert worker_config(config, 1, 16).runtime.intra_op_threads == 1
    pinned = ServerConfig(repository=config.repository, runtime=RuntimeConfig(intra_op_threads=3))
    assert worker_config(pinned, 1, 4).runtime.intra_op_threads == 3


def test_the_reserved_port_is_shared_by_reuseport_sockets_only() -> None:
    with reserve_port("127.0.0.1:0") as port:
        assert port > 0
        with socket.socket() as worker:  # what grpc.so_reuseport does in each worker
            worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            worker.bind(("127.0.0.1", port))
            worker.listen()
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # another program: address in use
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with (
            pytest.raises(OSError, match=r"cannot listen on .*in use"),
            reserve_port(f"127.0.0.1:{taken.getsockname()[1]}"),
        ):
            pass


def test_multiprocess_metrics_sum_counters_and_queue_depth_and_drop_retired_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two "workers" (two Metrics writing under two pids) read through the supervisor's
    registry: counters and queue depth summed, model info one series per served version."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    for pid in (101, 102):
        monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda pid=pid: pid))
        metrics = Metrics(CollectorRegistry())
        metrics.init_model("m")
        metrics.set_model_info("m", 1, "CPUExecutionProvider")
        metrics.set_model_info("m", 2, "CPUExecutionProvider")  # version 1 retired
        metrics.observe_request("Classify", "m", "OK", 0.01)
        metrics.for_model("m").on_queue_depth(3)
        metrics.for_model("m").on_inflight(5)  # the autoscaling signal: summed too
    registry = server_registry(str(tmp_path), lambda: [])
    get = registry.get_sample_value
    assert get("textserve_requests_total", {"method": "Classify", "model": "m"}) == 2
    assert get("textserve_queue_depth", {"model": "m"}) == 6
    assert get("textserve_inflight_texts", {"model": "m"}) == 10
    info = {"model": "m", "provider": "CPUExecutionProvider", "precision": "fp32"}
    assert get("textserve_model_info", {**info, "version": "2"}) == 1
    assert get("textserve_model_info", {**info, "version": "1"}) is None
    assert get("process_cpu_seconds_total") > 0
