"""The server's transport security: TLS / mutual TLS credentials for its port.

    port = add_port(server, "0.0.0.0:50051", config.security)   # TLS when configured

Bearer-token authentication is an interceptor (service/servicers/interceptors.py); the token
and PEM files are read with textserve.connect's functions, the same ones the client uses.
"""

from __future__ import annotations

import logging

import grpc

from textserve.connect import read_pem
from textserve.service.config import SecurityConfig

logger = logging.getLogger(__name__)


def server_credentials(security: SecurityConfig) -> grpc.ServerCredentials | None:
    """TLS credentials for the gRPC port (mutual TLS with tls_client_ca); None: plaintext."""
    if security.tls_cert is None or security.tls_key is None:
        return None
    chain = read_pem(security.tls_cert, "--tls-cert", "CERTIFICATE")
    key = read_pem(security.tls_key, "--tls-key", "PRIVATE KEY")
    client_ca = None
    if security.tls_client_ca is not None:
        client_ca = read_pem(security.tls_client_ca, "--tls-client-ca", "CERTIFICATE")
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def add_port(server: grpc.aio.Server, address: str, security: SecurityConfig) -> int:
    """Bind `address` with TLS when configured; the bound port (0 when binding failed)."""
    credentials = server_credentials(security)
    if credentials is None:
        return server.add_insecure_port(address)
    mode = "mutual TLS" if security.tls_client_ca is not None else "TLS"
    logger.info("%s on %s (certificate %s)", mode, address, security.tls_cert)
    return server.add_secure_port(address, credentials)
