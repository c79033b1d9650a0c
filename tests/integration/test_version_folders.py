"""`textserve serve` (the console script's code in a child process, not the in-process helper)
beside folders that are not versions: the one rule of textserve.artifact decides, everywhere."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import pytest

from tests.serving import serve_subprocess
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc


@pytest.mark.parametrize("workers", ["1", "auto"])
def test_serve_skips_a_superscript_folder_and_serves_the_good_version(
    tiny_repository: Path, tmp_path: Path, workers: str
) -> None:
    repository = tmp_path / "models"
    shutil.copytree(tiny_repository, repository)
    # str.isdigit("²") is true and int("²") raises: the worker sizing once crashed the CLI with
    # a ValueError traceback here, for every --workers value, before the scan ever ran. A whole
    # copy of version 1 makes the folder as tempting as a stray folder can be.
    shutil.copytree(repository / "tiny" / "1", repository / "tiny" / "²")
    (repository / "tiny" / "012").mkdir()
    with serve_subprocess(repository, "--workers", workers) as server:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.ClassifierStub(channel)
            model = stub.GetModel(pb.GetModelRequest(name="tiny"), timeout=30)
            reply = stub.Classify(pb.ClassifyRequest(texts=["a good film"]), timeout=30)
        assert model.version == 1
        assert reply.model_version == 1 and len(reply.results) == 1
    assert "Traceback" not in server.text()
    assert "folder '²' is not a version" in server.text()
