"""Request-provided names and versions on a real server (hand-built model, both APIs and admin):
OIP version strings parsed as strictly as repository folder names, and a name of megabytes
answered NOT_FOUND with a short message and no long log line."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import grpc
import pytest

from tests.handmade import make_version
from tests.serving import RunningServer, running_server
from textserve.oip import grpc_service_pb2 as ipb
from textserve.oip import grpc_service_pb2_grpc as ipb_grpc
from textserve.service.dataplane.oip_codec import pack_bytes
from textserve.v1 import admin_pb2, admin_pb2_grpc
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

HUGE = 3_000_000  # characters of the model name: under the server's 4 MiB message limit
# Versions no repository folder can be named (repository folder names are parsed the same way).
BAD_VERSIONS = ["²", "١", "01", "0", "-1", "+1", " 1", "1 ", "1.0", "0x1", "9" * 19, "1" * 400]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = tmp_path_factory.mktemp("models")
    make_version(repository, "m", 1)
    with running_server(repository, enable_admin=True) as srv:
        yield srv


@pytest.fixture(scope="module")
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    # Big enough to send the huge name; the answer must fit grpc's default receive limits.
    options = [("grpc.max_send_message_length", 8 * 1024 * 1024)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        yield channel


def status(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def infer_request(model: str, version: str = "") -> ipb.ModelInferRequest:
    request = ipb.ModelInferRequest(model_name=model, model_version=version)
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(pack_bytes([b"a good film"]))
    return request


@pytest.mark.parametrize("version", BAD_VERSIONS)
def test_oip_versions_are_canonical_decimals_within_int64(
    channel: grpc.Channel, version: str
) -> None:
    oip = ipb_grpc.GRPCInferenceServiceStub(channel)
    ready = oip.ModelReady(ipb.ModelReadyRequest(name="m", version=version), timeout=30)
    assert ready.ready is False
    for call in (
        lambda: oip.ModelMetadata(ipb.ModelMetadataRequest(name="m", version=version), timeout=30),
        lambda: oip.ModelInfer(infer_request("m", version), timeout=30),
    ):
        code, message = status(call)
        assert code == grpc.StatusCode.NOT_FOUND, (code, message)
        assert "has no version" in message and len(message) < 300, message


def test_a_canonical_oip_version_still_serves(channel: grpc.Channel) -> None:
    oip = ipb_grpc.GRPCInferenceServiceStub(channel)
    assert oip.ModelReady(ipb.ModelReadyRequest(name="m", version="1"), timeout=30).ready
    assert oip.ModelInfer(infer_request("m", "1"), timeout=30).model_version == "1"
    code, message = status(lambda: oip.ModelInfer(infer_request("m", str(2**63 - 1)), timeout=30))
    assert code == grpc.StatusCode.NOT_FOUND and "has no version 9223372036854775807" in message


@pytest.mark.parametrize("length", [256, HUGE])
def test_an_overlong_model_name_is_not_found_with_a_short_message_on_every_api(
    server: RunningServer,
    channel: grpc.Channel,
    caplog: pytest.LogCaptureFixture,
    length: int,
) -> None:
    name = "n" * length
    classifier = pb_grpc.ClassifierStub(channel)
    oip = ipb_grpc.GRPCInferenceServiceStub(channel)
    admin = admin_pb2_grpc.AdminStub(channel)
    calls = {
        "Classify": lambda: classifier.Classify(
            pb.ClassifyRequest(model=name, texts=["a good film"]), timeout=30
        ),
        "GetModel": lambda: classifier.GetModel(pb.GetModelRequest(name=name), timeout=30),
        "ModelMetadata": lambda: oip.ModelMetadata(ipb.ModelMetadataRequest(name=name), timeout=30),
        "ModelInfer": lambda: oip.ModelInfer(infer_request(name), timeout=30),
        "ModelInfer(version)": lambda: oip.ModelInfer(infer_request(name, "²"), timeout=30),
        "LoadModel": lambda: admin.LoadModel(admin_pb2.LoadModelRequest(name=name), timeout=30),
        "UnloadModel": lambda: admin.UnloadModel(
            admin_pb2.UnloadModelRequest(name=name), timeout=30
        ),
    }
    with caplog.at_level(logging.DEBUG):
        for rpc, call in calls.items():
            code, message = status(call)
            assert code == grpc.StatusCode.NOT_FOUND, (rpc, code, message[:200])
            assert f"'{'n' * 64}…' ({length} characters)" in message, (rpc, message[:200])
            assert len(message) < 300, (rpc, len(message))
        assert oip.ModelReady(ipb.ModelReadyRequest(name=name), timeout=30).ready is False
    longest = max((len(r.getMessage()) for r in caplog.records), default=0)
    assert longest < 1000
    # the server goes on
    reply = classifier.Classify(pb.ClassifyRequest(model="m", texts=["a good film"]), timeout=30)
    assert len(reply.results) == 1
