"""--engine process (service/engine/remote.py) on a real server: batches are tokenized and run
in a process of the version's own, with the same answers, refusals and metrics as in the
serving process; the engine process goes with its version (hot reload, stop), a killed one is
replaced by the next batch, and a flag it cannot take is one line and status 2."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest

from tests.handmade import make_version
from tests.serving import RunningServer, running_server
from textserve import cli
from textserve.service.config import RuntimeConfig
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

TEXTS = ["a good film", "the plot is bad", "great great film", "awful", "a film"]
PROCESS = RuntimeConfig(intra_op_threads=1, engine="process")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    make_version(root, "handmade", 1, max_length=8)
    return root


def scores(srv: RunningServer, texts: list[str], **fields: object) -> pb.ClassifyResponse:
    with srv.channel() as channel:
        request = pb.ClassifyRequest(texts=texts, all_scores=True, **fields)  # type: ignore[arg-type]
        return pb_grpc.ClassifierStub(channel).Classify(request, timeout=30)


def engine_pid(srv: RunningServer) -> int:
    pid = srv.server.repository.get()._engine.pid  # type: ignore[union-attr]
    assert pid is not None and pid != os.getpid()
    return pid


@pytest.fixture(scope="module")
def in_thread(repository: Path) -> Iterator[RunningServer]:
    with running_server(repository) as srv:
        yield srv


def answer_and_refuse(srv: RunningServer) -> tuple[pb.ClassifyResponse, float]:
    """TEXTS' answer, then a request refused in its batch (a text too long, truncate=false):
    the answer and the predictions counted (the refused request's texts are no answers)."""
    answer = scores(srv, TEXTS)
    long = " ".join(["good film"] * 20)
    with pytest.raises(grpc.RpcError) as refused:
        scores(srv, ["a film", long], truncate=False)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "texts[1]" in refused.value.details()
    registry = srv.metrics.registry
    labels = ("negative", "positive")
    counted = [
        registry.get_sample_value(
            "textserve_predictions_total", {"model": "handmade", "version": "1", "label": label}
        )
        for label in labels
    ]
    return answer, sum(c or 0.0 for c in counted)


def test_answers_refusals_and_metrics_are_those_of_the_thread(
    repository: Path, in_thread: RunningServer
) -> None:
    expected, predicted_here = answer_and_refuse(in_thread)
    assert predicted_here == len(TEXTS)
    with running_server(repository, runtime=PROCESS) as srv:
        pid = engine_pid(srv)
        assert psutil.Process(pid).ppid() == os.getpid()
        got, predicted = answer_and_refuse(srv)
        np.testing.assert_array_equal(
            [list(r.scores) for r in got.results], [list(r.scores) for r in expected.results]
        )
        assert [r.num_tokens for r in got.results] == [r.num_tokens for r in expected.results]
        registry = srv.metrics.registry
        batches = registry.get_sample_value("textserve_batch_size_count", {"model": "handmade"})
        tokenize = registry.get_sample_value(
            "textserve_tokenize_duration_seconds_count", {"model": "handmade"}
        )
    assert batches and batches >= 1
    assert predicted == len(TEXTS)
    assert tokenize and tokenize >= 1
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_the_engine_process_goes_with_its_version(tmp_path: Path) -> None:
    make_version(tmp_path, "handmade", 1, max_length=8)
    with running_server(tmp_path, runtime=PROCESS, poll_interval=0.2) as srv:
        first = engine_pid(srv)
        make_version(tmp_path, "handmade", 2, max_length=8, seed=1)
        deadline = time.monotonic() + 60
        while srv.server.repository.get().version != 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        second = engine_pid(srv)
        assert second != first
        while psutil.pid_exists(first) and time.monotonic() < deadline:
            if psutil.Process(first).status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.1)
        assert not psutil.pid_exists(first) or psutil.Process(first).status() == "zombie"
        assert scores(srv, TEXTS).model_version == 2


def test_a_killed_engine_process_is_replaced(repository: Path) -> None:
    with running_server(repository, runtime=PROCESS) as srv:
        pid = engine_pid(srv)
        os.kill(pid, signal.SIGKILL)
        psutil.Process(pid).wait(10)
        with pytest.raises(grpc.RpcError) as failed:  # the batch it was to answer
            scores(srv, TEXTS)
        assert failed.value.code() == grpc.StatusCode.INTERNAL
        answer = scores(srv, TEXTS)  # the next batch starts a new engine process
        assert len(answer.results) == len(TEXTS)
        assert engine_pid(srv) != pid


def test_engine_process_with_a_cache_is_one_line_and_status_2(
    repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--repository", str(repository), "--workers", "1", "--engine", "process"]
    assert cli.main([*argv, "--cache-size", "64MiB"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("textserve serve: error: --engine process does not take --cache-size")
    with pytest.raises(SystemExit) as bad:  # argparse's choices: one line, status 2
        cli.main([*argv[:-1], "elsewhere"])
    assert bad.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "argument --engine: invalid choice: 'elsewhere'" in line
