"""Transport security and authentication on a real server: TLS, mutual TLS (certificates made by
the test), bearer tokens on both APIs, open health and reflection, the client library, the CLI
and the health probe speaking TLS, startup errors for unusable files, the metrics address."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.certs import Pki, make_chain_pki, make_pki
from tests.serving import RunningServer, running_server
from textserve.cli import main as cli_main
from textserve.client import AsyncClient, Client, ClientError
from textserve.commands import probe as health_probe
from textserve.connect import channel_credentials
from textserve.oip import grpc_service_pb2 as ipb
from textserve.oip import grpc_service_pb2_grpc as ipb_grpc
from textserve.service.config import SecurityConfig
from textserve.service.dataplane.oip_codec import pack_bytes
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

TOKENS = ["tok-alpha-0123456789abcdef", "tok-bravo-0123456789abcdef"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "tokens"
    path.write_text(f"# textserve tokens\n{TOKENS[0]}\n\n  {TOKENS[1]}  \n")
    return path


@pytest.fixture(scope="module")
def mtls_server(tiny_repository: Path, pki: Pki, token_file: Path) -> Iterator[RunningServer]:
    """Mutual TLS and bearer tokens together, as a locked-down deployment runs."""
    security = SecurityConfig(
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        tls_client_ca=pki.ca_cert,
        auth_token_file=token_file,
    )
    credentials = channel_credentials(pki.ca_cert, pki.client_cert, pki.client_key)
    with running_server(tiny_repository, security=security, credentials=credentials) as srv:
        yield srv


@pytest.fixture(scope="module")
def token_server(tiny_repository: Path, token_file: Path) -> Iterator[RunningServer]:
    with running_server(
        tiny_repository, security=SecurityConfig(auth_token_file=token_file)
    ) as srv:
        yield srv


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def code_of(call: object) -> grpc.StatusCode:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_tls_serves_clients_that_trust_its_ca_only(tiny_repository: Path, pki: Pki) -> None:
    security = SecurityConfig(tls_cert=pki.server_cert, tls_key=pki.server_key)
    credentials = channel_credentials(pki.ca_cert)
    with running_server(tiny_repository, security=security, credentials=credentials) as srv:
        with Client(srv.address, ca=pki.ca_cert) as client:
            assert client.classify(["a gripping film"]).predictions[0].label

        async def async_call() -> str:
            async with AsyncClient(srv.address, ca=pki.ca_cert) as client:
                return (await client.classify(["a dull plot"])).predictions[0].label

        assert asyncio.run(async_call())
        with Client(srv.address, timeout=5) as plain, pytest.raises(ClientError) as plain_error:
            plain.classify(["plaintext to a TLS port"])
        assert plain_error.value.code == "UNAVAILABLE"
        with (
            Client(srv.address, ca=pki.rogue_ca_cert, timeout=5) as wrong,
            pytest.raises(ClientError) as trust_error,
        ):
            wrong.classify(["a server this client does not trust"])
        assert trust_error.value.code == "UNAVAILABLE"


def test_certificate_chains_through_an_intermediate_ca(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """Both sides trust only the root; each presents its leaf and the intermediate CA that
    signed it (--tls-cert and the client's cert may be chains), and that is enough."""
    chain = make_chain_pki(tmp_path / "pki")
    security = SecurityConfig(
        tls_cert=chain.server_chain, tls_key=chain.server_key, tls_client_ca=chain.root_cert
    )
    credentials = channel_credentials(chain.root_cert, chain.client_chain, chain.client_key)
    with (
        running_server(tiny_repository, security=security, credentials=credentials) as srv,
        Client(
            srv.address, ca=chain.root_cert, cert=chain.client_chain, key=chain.client_key
        ) as client,
    ):
        assert client.classify(["a gripping film"]).predictions[0].label
    # the intermediate is what makes it work: a server sending its leaf alone is not trusted
    intermediate = chain.server_chain.read_bytes().removeprefix(chain.server_leaf.read_bytes())
    both = tmp_path / "root-and-intermediate.pem"  # the test's own readiness check trusts both
    both.write_bytes(chain.root_cert.read_bytes() + intermediate)
    alone = SecurityConfig(tls_cert=chain.server_leaf, tls_key=chain.server_key)
    with running_server(
        tiny_repository, security=alone, credentials=channel_credentials(both)
    ) as srv:
        with (
            Client(srv.address, ca=chain.root_cert, timeout=5) as client,
            pytest.raises(ClientError) as info,
        ):
            client.classify(["a server whose chain is cut"])
        assert info.value.code == "UNAVAILABLE"


def test_mutual_tls_refuses_clients_without_a_valid_certificate(
    mtls_server: RunningServer, pki: Pki
) -> None:
    address = mtls_server.address
    refused = {
        "no client certificate": {"ca": pki.ca_cert},
        "a certificate from another CA": {
            "ca": pki.ca_cert,
            "cert": pki.rogue_client_cert,
            "key": pki.rogue_client_key,
        },
    }
    for why, options in refused.items():
        with Client(address, timeout=5, token=TOKENS[0], **options) as client:  # type: ignore[arg-type]
            with pytest.raises(ClientError) as info:
                client.classify(["let me in"])
            assert info.value.code == "UNAVAILABLE", why
    with Client(
        address, ca=pki.ca_cert, cert=pki.client_cert, key=pki.client_key, token=TOKENS[1]
    ) as client:
        result = client.classify(["a gripping, beautifully acted film"])
    assert result.predictions[0].label in mtls_server.server.repository.get().labels


def test_health_probe_speaks_mutual_tls(mtls_server: RunningServer, pki: Pki) -> None:
    args = ["--address", mtls_server.address, "--timeout", "5", "--tls-ca", str(pki.ca_cert)]
    client = ["--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key)]
    assert health_probe.main([*args, *client]) == 0  # no token needed: health stays open
    assert health_probe.main(args) == 1  # no client certificate: refused
    assert health_probe.main(["--address", mtls_server.address, "--timeout", "5"]) == 1


def test_health_probe_takes_its_tls_settings_from_the_environment(
    mtls_server: RunningServer, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The image's HEALTHCHECK passes only --address: a TLS container configures it by env.
    healthcheck = ["--address", mtls_server.address]
    monkeypatch.setenv("TEXTSERVE_PROBE_TIMEOUT", "5")
    monkeypatch.setenv("TEXTSERVE_PROBE_TLS_CA", str(pki.ca_cert))
    assert health_probe.main(healthcheck) == 1  # mutual TLS: no client certificate yet
    monkeypatch.setenv("TEXTSERVE_PROBE_TLS_CERT", str(pki.client_cert))
    monkeypatch.setenv("TEXTSERVE_PROBE_TLS_KEY", str(pki.client_key))
    assert health_probe.main(healthcheck) == 0
    monkeypatch.setenv("TEXTSERVE_PROBE_TLS_SERVER_NAME", "not-the-server.example")
    assert health_probe.main(healthcheck) == 1  # the certificate does not carry that name


def test_classify_cli_speaks_mutual_tls_and_sends_the_token(
    mtls_server: RunningServer,
    pki: Pki,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("TEXTSERVE_TOKEN", raising=False)
    base = ["classify", "--server", mtls_server.address, "--timeout", "10", "--json",
            "--tls-ca", str(pki.ca_cert), "--tls-cert", str(pki.client_cert),
            "--tls-key", str(pki.client_key)]  # fmt: skip
    token_file = tmp_path / "token"
    token_file.write_text(TOKENS[0] + "\n")
    assert cli_main([*base, "--token-file", str(token_file), "a gripping film"]) == 0
    assert '"label"' in capsys.readouterr().out

    assert cli_main([*base, "a gripping film"]) == 2
    err = capsys.readouterr().err
    assert "the server refused the call: missing credentials" in err and "--token-file" in err

    monkeypatch.setenv("TEXTSERVE_TOKEN", TOKENS[1])
    assert cli_main([*base, "a dull plot"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("TEXTSERVE_TOKEN", "not-a-valid-token-0000")
    assert cli_main([*base, "a dull plot"]) == 2
    err = capsys.readouterr().err
    assert "invalid bearer token" in err and "not-a-valid-token" not in err


def test_bearer_tokens_guard_both_apis(token_server: RunningServer) -> None:
    model = token_server.server.repository.get().name
    classify = pb.ClassifyRequest(texts=["a gripping film"])
    infer = ipb.ModelInferRequest(
        model_name=model,
        inputs=[ipb.ModelInferRequest.InferInputTensor(name="TEXT", datatype="BYTES", shape=[1])],
        raw_input_contents=[pack_bytes([b"a gripping film"])],
    )
    with token_server.channel() as channel:
        stub = pb_grpc.ClassifierStub(channel)
        oip = ipb_grpc.GRPCInferenceServiceStub(channel)
        calls = {
            "Classify": lambda md: stub.Classify(classify, timeout=10, metadata=md),
            "ClassifyStream": lambda md: list(
                stub.ClassifyStream(iter([classify]), timeout=10, metadata=md)
            ),
            "ListModels": lambda md: stub.ListModels(
                pb.ListModelsRequest(), timeout=10, metadata=md
            ),
            "ModelInfer": lambda md: oip.ModelInfer(infer, timeout=10, metadata=md),
            "ServerMetadata": lambda md: oip.ServerMetadata(
                ipb.ServerMetadataRequest(), timeout=10, metadata=md
            ),
        }
        refused = {
            "no token": (),
            "wrong token": bearer("tok-charlie-0123456789abcdef"),
            "a token's prefix": bearer(TOKENS[0][:-1]),
            "another scheme": (("authorization", f"Basic {TOKENS[0]}"),),
            "two tokens": (*bearer(TOKENS[0]), *bearer(TOKENS[1])),
        }
        for name, call in calls.items():
            for why, metadata in refused.items():
                with pytest.raises(grpc.RpcError) as info:
                    call(metadata)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, (name, why)
                assert TOKENS[0][:8] not in (info.value.details() or "")  # never echoed
            for token in TOKENS:  # every token in the file is accepted
                call(bearer(token))
            call((("authorization", f"bearer  {TOKENS[0]} "),))  # scheme is case-insensitive

        # probes and tools need no token
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert oip.ServerLive(ipb.ServerLiveRequest(), timeout=10).live
        assert oip.ServerReady(ipb.ServerReadyRequest(), timeout=10).ready
        with pytest.raises(grpc.RpcError) as info:
            oip.ModelReady(ipb.ModelReadyRequest(name="default"), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (listing,) = list(reflection.ServerReflectionInfo(iter([request])))
        assert "textserve.v1.Classifier" in {s.name for s in listing.list_services_response.service}


def test_client_library_sends_its_token(token_server: RunningServer) -> None:
    with Client(token_server.address, token=TOKENS[0]) as client:
        assert client.classify(["a gripping film"]).predictions[0].label
        assert client.list_models().models
    with Client(token_server.address) as client, pytest.raises(ClientError) as info:
        client.classify(["a gripping film"])
    assert info.value.code == "UNAUTHENTICATED"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--tls-cert", "{missing}", "--tls-key", "{missing}"],
            "--tls-cert {missing}: cannot read",
        ),
        (["--tls-cert", "{token}", "--tls-key", "{token}"], "not a PEM file holding a certificate"),
        (["--tls-key", "{token}"], "--tls-cert and --tls-key go together"),
        (["--tls-client-ca", "{token}"], "--tls-client-ca (mutual TLS) needs TLS itself"),
        (["--auth-token-file", "{empty}"], "holds no token"),
        (["--auth-token-file", "{missing}"], "--auth-token-file {missing}: cannot read"),
        (["--max-message-bytes", "10"], "--max-message-bytes must be at least 1024"),
    ],
)
def test_unusable_security_settings_are_startup_errors(
    tiny_repository: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    message: str,
) -> None:
    (tmp_path / "token").write_text(TOKENS[0])
    (tmp_path / "empty").write_text("# nothing yet\n\n")
    names = {k: str(tmp_path / k) for k in ("missing", "token", "empty")}
    argv = ["serve", "--repository", str(tiny_repository), "--listen", "127.0.0.1:0",
            "--metrics-port", "off", *(f.format(**names) for f in flags)]  # fmt: skip
    assert cli_main(argv) == 2
    assert message.format(**names) in capsys.readouterr().err


def test_a_tls_key_that_is_not_the_certificates_is_a_startup_error(
    tiny_repository: Path, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--repository", str(tiny_repository), "--listen", "127.0.0.1:0",
            "--metrics-port", "off", "--tls-cert", str(pki.server_cert),
            "--tls-key", str(pki.client_key)]  # fmt: skip
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert (
        f"--tls-key {pki.client_key}: the private key does not match the certificate "
        f"(--tls-cert {pki.server_cert})"
    ) in err
    assert "bind" not in err and len(err.strip().splitlines()) == 1, err


def _can_bind(host: str) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, 0))
        except OSError:
            return False
    return True


def test_metrics_endpoint_binds_its_own_address(tiny_repository: Path) -> None:
    # 127.0.0.2 is loopback on Linux: a second address on which only the metrics listen
    if not _can_bind("127.0.0.2"):
        pytest.skip("this host cannot bind 127.0.0.2")
    with running_server(tiny_repository, metrics_port=0, metrics_host="127.0.0.2") as srv:
        port = srv.server.metrics_port
        with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=10) as response:
            assert b"textserve_queue_depth" in response.read()
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
