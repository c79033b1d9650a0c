"""Hot reload on a real server: versions exported under load are served with zero failed
requests and only forward; a broken version is never served; load/unload cycles through the
admin RPCs leave resident memory settled."""

from __future__ import annotations

import dataclasses
import gc
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

from tests.serving import poll, running_server
from textserve.artifact import MODEL_FILE, Manifest, newest_version
from textserve.client import AdminClient
from textserve.oip import grpc_service_pb2 as oip
from textserve.oip import grpc_service_pb2_grpc as oip_grpc
from textserve.service.engine.handle import ModelHandle
from textserve.service.engine.runtime import Session
from textserve.service.metrics import Metrics
from textserve.service.repository.core import ModelRepository
from textserve.service.repository.policy import parse_policies
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

CALLERS = 32  # half through textserve.v1, half through OIP
TEXTS = ["a gripping, beautifully acted film", "dull", "the plot is a mess and far too long", "ok"]


class Caller(threading.Thread):
    """Sends requests one after another until stopped; records each answer's version in order
    and every failure. `oip`: through the Open Inference Protocol instead of textserve.v1."""

    def __init__(self, address: str, stop: threading.Event, *, oip: bool = False) -> None:
        super().__init__(daemon=True)
        self.address, self.stop, self.oip = address, stop, oip
        self.versions: list[int] = []
        self.failures: list[str] = []

    def run(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            classify = pb_grpc.ClassifierStub(channel).Classify
            infer = oip_grpc.GRPCInferenceServiceStub(channel).ModelInfer
            i = 0
            while not self.stop.is_set():
                i += 1
                texts = TEXTS[: 1 + i % len(TEXTS)]
                try:
                    if self.oip:
                        request = oip.ModelInferRequest(model_name="tiny")
                        tensor = request.inputs.add(
                            name="TEXT", datatype="BYTES", shape=[len(texts)]
                        )
                        tensor.contents.bytes_contents.extend(t.encode() for t in texts)
                        self.versions.append(int(infer(request, timeout=30).model_version))
                    else:
                        response = classify(pb.ClassifyRequest(texts=texts), timeout=30)
                        assert len(response.results) == len(texts)
                        self.versions.append(response.model_version)
                except Exception as exc:  # every failure is recorded, none ends the caller
                    self.failures.append(repr(exc))


class InfoSampler(threading.Thread):
    """Reads textserve_model_info{model="tiny"} continuously: the versions it reported, in order."""

    def __init__(self, metrics: Metrics, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.metrics, self.stop = metrics, stop
        self.seen: list[int] = []

    def run(self) -> None:
        while not self.stop.is_set():
            for family in self.metrics.registry.collect():
                if family.name == "textserve_model_info":
                    versions = [int(s.labels["version"]) for s in family.samples if s.value == 1]
                    if versions and (not self.seen or self.seen[-1] != max(versions)):
                        self.seen.append(max(versions))
            time.sleep(0.005)


def drop_broken_version(model_dir: Path) -> int:
    """A version whose manifest is valid but whose model.onnx was corrupted after export."""
    found = newest_version(model_dir)  # textserve.artifact's rule, as the server's
    assert found is not None
    newest = found[0]
    broken = model_dir / str(newest + 1)
    staging = model_dir / f".tmp-broken-{newest + 1}"
    shutil.copytree(model_dir / str(newest), staging)
    manifest = Manifest.read(staging)
    dataclasses.replace(manifest, version=newest + 1).write(staging)
    with open(staging / MODEL_FILE, "r+b") as fh:
        fh.seek(200)
        fh.write(b"\x00" * 64)  # same size, different bytes: only the checksum can tell
    staging.rename(broken)  # published atomically, as an export would
    return newest + 1


@pytest.mark.slow
def test_versions_published_under_load_lose_no_request(
    tiny_run: Path, tiny_repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from textserve.export.pipeline import export_run

    repository = tmp_path / "models"
    shutil.copytree(tiny_repository, repository)
    stop = threading.Event()
    # The requests in flight in the version being retired, at each switch: the drain must
    # finish every one of them.
    in_flight: list[tuple[int, int]] = []
    retire = ModelRepository._retire

    def recording_retire(self: ModelRepository, record: Any, entry: Any) -> None:
        in_flight.append((entry.version, entry.handle._active if entry.handle else 0))
        retire(self, record, entry)

    monkeypatch.setattr(ModelRepository, "_retire", recording_retire)
    with running_server(repository, poll_interval=0.2) as srv, srv.channel() as channel:
        stub = pb_grpc.ClassifierStub(channel)
        callers = [Caller(srv.address, stop, oip=i % 2 == 1) for i in range(CALLERS)]
        sampler = InfoSampler(srv.metrics, stop)

        def state_of(version: int) -> int:
            info = stub.GetModel(pb.GetModelRequest(name="tiny"), timeout=10)
            return {v.version: v.state for v in info.versions}.get(version, 0)

        def served_by_all(version: int) -> Callable[[], bool]:
            seen = [len(c.versions) for c in callers]
            # Each caller got an answer from `version` after it was published: traffic spans
            # every switch, and the default version moved for both front ends.
            return lambda: all(
                len(c.versions) > n and c.versions[-1] == version
                for c, n in zip(callers, seen, strict=True)
            )

        def hold_requests() -> None:
            """Hold the served version's queue until the switch: at least half the callers
            have a request in it then (the drain runs them; a pause ends with the version)."""
            handle = srv.server.repository.get()
            srv.call(handle.batcher.pause)
            poll(lambda: handle._active >= CALLERS // 2, "requests to wait in the queue")

        for thread in (*callers, sampler):
            thread.start()
        published: list[int] = []
        try:
            hold_requests()
            version = int(export_run(tiny_run, repository, "tiny", threads=1).name)
            published.append(version)
            poll(served_by_all(version), f"version {version} to be served")
            broken = drop_broken_version(repository / "tiny")
            poll(lambda: state_of(broken) == pb.MODEL_STATE_FAILED, f"{broken} to be refused")
            for _ in range(2):
                hold_requests()
                version = int(export_run(tiny_run, repository, "tiny", threads=1).name)
                published.append(version)
                poll(served_by_all(version), f"version {version} to be served")
        finally:
            stop.set()
            for thread in (*callers, sampler):
                thread.join(timeout=60)
        info = stub.GetModel(pb.GetModelRequest(name="tiny"), timeout=10)

    assert published == [2, 4, 5] and broken == 3
    # three switches (1 -> 2 -> 4 -> 5), each with requests in flight in the retired version
    assert [v for v, _ in in_flight] == [1, 2, 4], in_flight
    assert all(active >= CALLERS // 2 for _, active in in_flight), in_flight
    for caller in callers:
        assert caller.failures == []
        assert caller.versions == sorted(caller.versions), "a response went back a version"
        assert broken not in caller.versions
        assert set(caller.versions) >= {2, 4, 5}
    assert sampler.seen == sorted(sampler.seen) and broken not in sampler.seen
    assert sampler.seen[-1] == 5
    assert info.version == 5
    refused = {v.version: v for v in info.versions}[broken]
    assert refused.state == pb.MODEL_STATE_FAILED
    assert "does not match the manifest" in refused.reason
    value = srv.metrics.registry.get_sample_value
    failures = {"model": "tiny", "reason": "checksum_mismatch"}
    assert value("textserve_model_load_failures_total", failures) == 1
    served = {"model": "tiny", "provider": info.execution_provider, "precision": info.precision}
    assert value("textserve_model_info", {**served, "version": "5"}) == 1
    assert value("textserve_model_info", {**served, "version": "4"}) is None


def live(kind: type) -> int:
    gc.collect()  # handles form reference cycles (batcher <-> handle): count only reachable ones
    return sum(1 for o in gc.get_objects() if type(o) is kind)  # no isinstance: proxies warn


def test_load_unload_cycles_leave_resident_memory_settled(
    tiny_repository: Path, tmp_path: Path
) -> None:
    repository = tmp_path / "models"
    shutil.copytree(tiny_repository, repository)
    shutil.copytree(repository / "tiny" / "1", repository / "tiny" / "2")
    manifest = Manifest.read(repository / "tiny" / "2")
    dataclasses.replace(manifest, version=2).write(repository / "tiny" / "2")
    process = psutil.Process()
    rss: dict[int, int] = {}
    with (
        running_server(
            repository,
            enable_admin=True,
            poll_interval=0,
            version_policy=parse_policies("specific:1"),  # 1 serves; 2 comes and goes by hand
        ) as srv,
        AdminClient(srv.address) as admin,
        srv.channel() as channel,
    ):
        classify = pb_grpc.ClassifierStub(channel).Classify
        for cycle in range(1, 51):
            admin.load_model("tiny", 2)
            response = classify(pb.ClassifyRequest(texts=TEXTS * 8, model="tiny"), timeout=30)
            assert response.model_version == 2  # it ran: session, arena and batcher thread used
            admin.unload_model("tiny", 2)  # returns once drained and released
            if cycle in (10, 50):
                gc.collect()  # cyclic garbage is not a leak: measure what stays reachable
                rss[cycle] = process.memory_info().rss
        assert [h.version for h in srv.server.repository.handles()] == [1]
        assert live(ModelHandle) == 1
        assert sum(1 for o in gc.get_objects() if type(o) is Session and o._session) == 1

    # Why 24 MiB: one loaded, warmed version of the tiny model holds ~2 MiB resident (session,
    # memory arena, batcher thread); keeping every unloaded version alive was measured at
    # +2.1 MiB a cycle, +80 MiB over the 40 cycles measured here. With sessions released, the
    # allocator settled within +5..9 MiB over the same cycles (first 10 cycles are warm-up:
    # thread pools, arenas, gRPC buffers). 24 MiB is well above that settling and under a third
    # of what a leak of each version would add.
    growth = rss[50] - rss[10]
    assert growth < 24 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB over 40 load/unload cycles"
