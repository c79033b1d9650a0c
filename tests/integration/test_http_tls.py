"""HTTPS and mutual TLS on the HTTP port: the gRPC port's --tls-cert/--tls-key/--tls-client-ca
serve the HTTP port too (service/http/server.py), checked with `requests` against a real server:
a client trusting the CA classifies over POST /v1/classify, plain HTTP to the port gets no
answer, a client trusting another CA refuses the server, and with client certificates required
a client without one (or with one of another CA) is refused while one with ours is served."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import requests

from tests.certs import Pki, make_pki
from tests.serving import RunningServer, running_server
from textserve.connect import channel_credentials
from textserve.service.config import HttpConfig, SecurityConfig

TEXTS = ["a gripping film", "a dull plot"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def https(srv: RunningServer, path: str, scheme: str = "https") -> str:
    return f"{scheme}://127.0.0.1:{srv.server.metrics_port}{path}"


def classify(srv: RunningServer, scheme: str = "https", **options: object) -> requests.Response:
    return requests.post(
        https(srv, "/v1/classify", scheme), json={"texts": TEXTS}, timeout=10, **options
    )


@pytest.fixture(scope="module")
def tls_server(tiny_repository: Path, pki: Pki) -> Iterator[RunningServer]:
    security = SecurityConfig(tls_cert=pki.server_cert, tls_key=pki.server_key)
    credentials = channel_credentials(pki.ca_cert)
    with running_server(
        tiny_repository, metrics_port=0, security=security, credentials=credentials
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def mtls_server(tiny_repository: Path, pki: Pki) -> Iterator[RunningServer]:
    security = SecurityConfig(
        tls_cert=pki.server_cert, tls_key=pki.server_key, tls_client_ca=pki.ca_cert
    )
    credentials = channel_credentials(pki.ca_cert, pki.client_cert, pki.client_key)
    with running_server(
        tiny_repository, metrics_port=0, security=security, credentials=credentials
    ) as srv:
        yield srv


def test_https_classifies_for_a_client_that_trusts_the_ca(
    tls_server: RunningServer, pki: Pki
) -> None:
    response = classify(tls_server, verify=str(pki.ca_cert))
    assert response.status_code == 200, response.text
    labels = tls_server.server.repository.get().labels
    results = response.json()["results"]
    assert len(results) == len(TEXTS) and all(r["label"] in labels for r in results)
    # The probes speak TLS too (a Kubernetes httpGet probe needs `scheme: HTTPS`).
    ready = requests.get(https(tls_server, "/readyz"), verify=str(pki.ca_cert), timeout=10)
    assert ready.text.strip() == "serving"


def test_plain_http_and_an_untrusted_server_fail(tls_server: RunningServer, pki: Pki) -> None:
    with pytest.raises(requests.ConnectionError):
        classify(tls_server, scheme="http")  # TLS port: a plaintext request gets no answer
    with pytest.raises(requests.exceptions.SSLError):
        classify(tls_server, verify=str(pki.rogue_ca_cert))
    with pytest.raises(requests.exceptions.SSLError):
        classify(tls_server)  # the system's CAs do not know the test CA either


def test_mutual_tls_refuses_a_client_without_our_certificate(
    mtls_server: RunningServer, pki: Pki
) -> None:
    ca = str(pki.ca_cert)
    # requests raises SSLError when the handshake fails, ConnectionError when the server
    # closes right after it (TLS 1.3 checks the client's certificate after the client's
    # Finished): either way no answer.
    with pytest.raises(requests.ConnectionError):
        classify(mtls_server, verify=ca)
    with pytest.raises(requests.ConnectionError):
        classify(
            mtls_server, verify=ca, cert=(str(pki.rogue_client_cert), str(pki.rogue_client_key))
        )
    # Open probes are no exception on this port: TLS comes before any route.
    with pytest.raises(requests.ConnectionError):
        requests.get(https(mtls_server, "/healthz"), verify=ca, timeout=10)
    served = classify(mtls_server, verify=ca, cert=(str(pki.client_cert), str(pki.client_key)))
    assert served.status_code == 200, served.text
    assert len(served.json()["results"]) == len(TEXTS)


def test_with_tls_the_banner_and_the_ready_file_say_https(tiny_repository: Path, pki: Pki) -> None:
    from tests.serving import serve_subprocess

    tls = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
    with serve_subprocess(tiny_repository, *tls) as proc:
        assert proc.metrics_url is not None and proc.metrics_url.startswith("https://")
        banner = proc.text()
        assert "(metrics: https://" in banner and "curl -s --cacert CA.pem https://" in banner
        assert "--tls-ca CA.pem" in banner and "http://" not in banner
        page = requests.get(proc.metrics_url, verify=str(pki.ca_cert), timeout=10)
        assert page.status_code == 200 and "textserve_requests_total" in page.text


def test_an_unfinished_tls_handshake_is_timed_and_counted(tiny_repository: Path, pki: Pki) -> None:
    """A connection that never finishes its handshake is closed after the header timeout (not
    asyncio's 60 s) and holds a place under --http-max-connections meanwhile: past the limit a
    new connection is closed before its handshake costs anything."""
    security = SecurityConfig(tls_cert=pki.server_cert, tls_key=pki.server_key)
    http = HttpConfig(header_timeout=1.0, max_connections=20)
    credentials = channel_credentials(pki.ca_cert)
    with running_server(
        tiny_repository, metrics_port=0, security=security, http=http, credentials=credentials
    ) as srv:
        port = srv.server.metrics_port or 0
        with ExitStack() as stack:
            silent = [
                stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
                for _ in range(20)
            ]  # TCP only: the server waits for a ClientHello
            time.sleep(0.3)
            with pytest.raises(requests.exceptions.ConnectionError):
                requests.get(https(srv, "/healthz"), verify=str(pki.ca_cert), timeout=5)
            started = time.monotonic()
            for sock in silent:
                sock.settimeout(5)
                assert sock.recv(1024) == b""  # closed by the server
            assert time.monotonic() - started < 3.0
        response = requests.get(https(srv, "/healthz"), verify=str(pki.ca_cert), timeout=5)
        assert response.status_code == 200
