"""The server's transport security: TLS / mutual TLS credentials for its port.

    port = add_port(server, "0.0.0.0:50051", config.security)   # TLS when configured

Bearer-token authentication is an interceptor (service/servicers/interceptors.py); the token
and PEM files are read with textserve.connect's functions, the same ones the client uses.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import grpc

from textserve.cli import ConfigError
from textserve.connect import read_pem
from textserve.service.config import SecurityConfig

logger = logging.getLogger(__name__)


def server_credentials(security: SecurityConfig) -> grpc.ServerCredentials | None:
    """TLS credentials for the gRPC port (mutual TLS with tls_client_ca); None: plaintext."""
    if security.tls_cert is None or security.tls_key is None:
        return None
    chain = read_pem(security.tls_cert, "--tls-cert", "CERTIFICATE")
    key = read_pem(security.tls_key, "--tls-key", "PRIVATE KEY")
    check_key_pair(security.tls_cert, security.tls_key)
    client_ca = None
    if security.tls_client_ca is not None:
        client_ca = read_pem(security.tls_client_ca, "--tls-client-ca", "CERTIFICATE")
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def check_key_pair(cert: Path, key: Path) -> None:
    """ConfigError naming --tls-cert/--tls-key unless the key is the certificate's: grpc only
    says "Failed to bind to address" then. The standard library's OpenSSL loads the pair as grpc
    would and says which is wrong (`cryptography` is no serving dependency)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # An encrypted key would make OpenSSL prompt on the terminal; grpc cannot use one anyway.
        context.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                f"--tls-key {key}: the private key does not match the certificate "
                f"(--tls-cert {cert})"
            ) from None
        raise ConfigError(
            f"--tls-cert {cert} / --tls-key {key}: cannot use them as a certificate and its "
            f"key ({exc.reason or exc})"
        ) from None
    except OSError as exc:  # read_pem read them just now; they changed meanwhile
        raise ConfigError(f"--tls-cert {cert} / --tls-key {key}: {exc}") from None


def add_port(server: grpc.aio.Server, address: str, security: SecurityConfig) -> int:
    """Bind `address` with TLS when configured; the bound port (0 when binding failed)."""
    credentials = server_credentials(security)
    if credentials is None:
        return server.add_insecure_port(address)
    mode = "mutual TLS" if security.tls_client_ca is not None else "TLS"
    logger.info("%s on %s (certificate %s)", mode, address, security.tls_cert)
    return server.add_secure_port(address, credentials)
