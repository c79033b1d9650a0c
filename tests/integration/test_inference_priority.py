"""--inference-nice on a real server (service/engine/priority.py): the thread that tokenizes and
runs batches and onnxruntime's own pool run `nice` below the event loop, an engine process
(`--engine process`) wholly; 0 leaves every thread as it was; a value out of range is one line
and status 2."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import psutil
import pytest

from tests.handmade import make_version
from tests.serving import RunningServer, running_server
from textserve import cli
from textserve.service.config import RuntimeConfig
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

pytestmark = pytest.mark.skipif(not hasattr(os, "getpriority"), reason="per-thread niceness")

NICE = 7  # not the default (10), so that no other test's server in this process is counted


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    make_version(root, "handmade", 1, max_length=8)
    return root


def classify(srv: RunningServer) -> None:
    with srv.channel() as channel:
        request = pb.ClassifyRequest(texts=["a good film", "awful"])
        assert len(pb_grpc.ClassifierStub(channel).Classify(request, timeout=30).results) == 2


def niceness(tid: int) -> int:
    """A thread's niceness, whichever process it belongs to (Linux: a thread id is a task)."""
    return os.getpriority(os.PRIO_PROCESS, tid)


def threads_at(pid: int, nice: int) -> set[int]:
    return {t.id for t in psutil.Process(pid).threads() if niceness(t.id) == nice}


def test_the_batch_thread_and_onnxruntimes_pool_run_below_the_loop(repository: Path) -> None:
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    before = threads_at(os.getpid(), base + NICE)
    runtime = RuntimeConfig(intra_op_threads=2, inference_nice=NICE)
    with running_server(repository, runtime=runtime) as srv:
        classify(srv)
        lowered = threads_at(os.getpid(), base + NICE) - before
        executor = srv.server.repository.get().batcher._executor
        batch_threads = {t.native_id for t in executor._threads}  # type: ignore[attr-defined]
        assert batch_threads and batch_threads <= lowered
        # onnxruntime's intra-op pool: intra_op_threads - 1 threads of the session's own
        assert len(lowered - batch_threads) >= 1
        assert srv.call(threading.get_native_id) not in lowered  # the event loop's thread
        assert threading.main_thread().native_id not in lowered


def test_an_engine_process_runs_below_the_serving_process(repository: Path) -> None:
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    runtime = RuntimeConfig(intra_op_threads=1, engine="process", inference_nice=NICE)
    with running_server(repository, runtime=runtime) as srv:
        classify(srv)
        pid = srv.server.repository.get()._engine.pid  # type: ignore[union-attr]
        assert pid is not None
        threads = {t.id for t in psutil.Process(pid).threads()}
        assert threads == threads_at(pid, min(19, base + NICE))


def test_zero_leaves_every_thread_at_the_loops_priority(repository: Path) -> None:
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    runtime = RuntimeConfig(intra_op_threads=2, inference_nice=0)
    with running_server(repository, runtime=runtime) as srv:
        classify(srv)
        executor = srv.server.repository.get().batcher._executor
        for thread in executor._threads:  # type: ignore[attr-defined]
            assert niceness(thread.native_id) == base


@pytest.mark.parametrize("value", ["20", "-1"])
def test_a_niceness_out_of_range_is_one_line_and_status_2(
    repository: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    argv = ["serve", "--repository", str(repository), "--inference-nice", value]
    assert cli.main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"textserve serve: error: --inference-nice must be between 0 and 19, got {value}"
    )
