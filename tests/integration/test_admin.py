"""The Admin service on a real server: off by default, listed in reflection when on, and
`textserve models load|unload|reload` driving it."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.serving import RunningServer, health, running_server
from textserve.artifact import MODEL_FILE, Manifest
from textserve.cli import main as cli_main
from textserve.client import AdminClient, ClientError
from textserve.service.config import SecurityConfig
from textserve.service.repository.policy import parse_policies
from textserve.v1 import admin_pb2
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc


def add_version(model_dir: Path, version: int, *, corrupt: bool = False) -> Path:
    """A copy of version 1 as `version` (same model, its own manifest); corrupt: bad checksum."""
    path = model_dir / str(version)
    shutil.copytree(model_dir / "1", path)
    dataclasses.replace(Manifest.read(path), version=version).write(path)
    if corrupt:
        with open(path / MODEL_FILE, "ab") as fh:
            fh.write(b"garbage")
    return path


@pytest.fixture()
def repository(tiny_repository: Path, tmp_path: Path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(tiny_repository, root)
    add_version(root / "tiny", 2)
    add_version(root / "tiny", 3, corrupt=True)
    return root


@pytest.fixture()
def admin_server(repository: Path) -> Iterator[RunningServer]:
    with running_server(
        repository,
        enable_admin=True,
        poll_interval=0,  # changes happen only through the admin RPCs here
        version_policy=parse_policies("specific:1"),
    ) as srv:
        yield srv


def services(srv: RunningServer) -> set[str]:
    with srv.channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (response,) = list(stub.ServerReflectionInfo(iter([request])))
    return {s.name for s in response.list_services_response.service}


def served(srv: RunningServer) -> int:
    with srv.channel() as channel:
        return (
            pb_grpc.ClassifierStub(channel)
            .Classify(pb.ClassifyRequest(texts=["a good film"]), timeout=30)
            .model_version
        )


def test_admin_is_off_by_default(tiny_repository: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with running_server(tiny_repository) as srv:
        assert "textserve.v1.Admin" not in services(srv)
        with AdminClient(srv.address) as admin, pytest.raises(ClientError) as exc:
            admin.reload_repository()
        assert exc.value.code == "UNIMPLEMENTED"
        assert cli_main(["models", "reload", "--server", srv.address]) == 2
    assert "start the server with --enable-admin" in capsys.readouterr().err


def test_admin_rpcs_load_unload_and_report_refusals(admin_server: RunningServer) -> None:
    assert "textserve.v1.Admin" in services(admin_server)
    assert served(admin_server) == 1
    with AdminClient(admin_server.address) as admin:
        loaded = admin.load_model("tiny", 2)
        assert [(e.version, e.action) for e in loaded.events] == [
            (2, admin_pb2.VersionEvent.ACTION_LOADED)
        ]
        assert loaded.model.ready_version == 2 and served(admin_server) == 2
        with pytest.raises(ClientError) as refused:
            admin.load_model("tiny", 3)
        assert refused.value.code == "FAILED_PRECONDITION"
        assert "version 3 was refused" in refused.value.message
        assert "does not match the manifest" in refused.value.message
        assert served(admin_server) == 2  # the refusal changed nothing
        unloaded = admin.unload_model("tiny", 2)
        assert unloaded.model.ready_version == 1 and served(admin_server) == 1
        with pytest.raises(ClientError) as missing:
            admin.unload_model("tiny", 9)
        assert missing.value.code == "NOT_FOUND"
        with pytest.raises(ClientError) as empty:
            admin.load_model("")
        assert empty.value.code == "INVALID_ARGUMENT"
    with admin_server.channel() as channel:
        info = pb_grpc.ClassifierStub(channel).GetModel(pb.GetModelRequest(name="tiny"))
    states = {v.version: (v.state, v.reason) for v in info.versions}
    assert states[3][0] == pb.MODEL_STATE_FAILED and "does not match" in states[3][1]
    value = admin_server.metrics.registry.get_sample_value
    labels = {"model": "tiny", "reason": "checksum_mismatch"}
    assert value("textserve_model_load_failures_total", labels) == 1  # startup skips 3: specific:1


def test_reload_repository_picks_up_a_new_version_without_polling(
    admin_server: RunningServer, repository: Path
) -> None:
    add_version(repository / "tiny", 4)
    (repository / "tiny" / "serving.json").write_text('{"version_policy": "latest:1"}')
    with AdminClient(admin_server.address) as admin:
        response = admin.reload_repository()
    assert [(e.version, e.action) for e in response.events] == [
        (4, admin_pb2.VersionEvent.ACTION_LOADED),
        (1, admin_pb2.VersionEvent.ACTION_UNLOADED),
    ]
    assert served(admin_server) == 4


def test_models_cli_load_unload_reload(
    admin_server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ["--server", admin_server.address]
    assert cli_main(["models", "load", "tiny", "2", *server]) == 0
    out = capsys.readouterr().out
    assert "tiny version 2 loaded" in out
    assert "tiny (default): serving 2; versions: 1 ready, 2 ready, 3 available" in out
    assert cli_main(["models", "load", "tiny", "3", *server]) == 1
    assert "version 3 was refused" in capsys.readouterr().err
    assert cli_main(["models", "unload", "tiny", "2", *server]) == 0
    assert "tiny version 2 unloading" in capsys.readouterr().out
    assert served(admin_server) == 1
    assert cli_main(["models", "reload", "--json", *server]) == 0
    assert '"ready_version": "1"' in capsys.readouterr().out
    assert cli_main(["models", "load", *server]) == 2
    assert "needs the model" in capsys.readouterr().err
    assert cli_main(["models", "unload", "nope", *server]) == 2
    assert "NOT_FOUND: model 'nope' not found" in capsys.readouterr().err


def test_models_cli_without_a_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["models", "reload", "--server", "127.0.0.1:1", "--timeout", "2"]) == 2
    assert "is a server listening on 127.0.0.1:1?" in capsys.readouterr().err


def test_admin_needs_the_token_when_the_server_has_one(
    repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text("s3cret-admin-token\n")
    security = SecurityConfig(auth_token_file=token_file)
    with running_server(repository, security=security, enable_admin=True, poll_interval=0) as srv:
        with AdminClient(srv.address) as anonymous, pytest.raises(ClientError) as refused:
            anonymous.reload_repository()
        assert refused.value.code == "UNAUTHENTICATED"
        server = ["--server", srv.address]
        assert cli_main(["models", "reload", *server]) == 2
        assert "--token-file" in capsys.readouterr().err
        argv = ["models", "unload", "tiny", "2", *server, "--token-file", str(token_file)]
        assert cli_main(argv) == 0
        assert "tiny (default): serving 1" in capsys.readouterr().out  # 2 rolled back


def test_health_is_not_serving_while_no_model_is_served(admin_server: RunningServer) -> None:
    def status(service: str) -> str:
        return health(admin_server.address, service)

    model_services = ("", "textserve.v1.Classifier", "inference.GRPCInferenceService")
    assert {status(s) for s in model_services} == {"SERVING"}
    with AdminClient(admin_server.address) as admin:
        admin.unload_model("tiny")  # the only model: nothing is served any more
        assert {status(s) for s in model_services} == {"NOT_SERVING"}
        assert status("textserve.v1.Admin") == "SERVING"  # the way back
        admin.load_model("tiny")
        assert {status(s) for s in model_services} == {"SERVING"}
    assert served(admin_server) == 1
