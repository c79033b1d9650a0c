"""Connection flags of the client subcommands (`textserve classify`, ...): TLS and bearer token.

    add_arguments(parser)                          # --tls, --tls-ca, --tls-cert, --tls-key, ...
    Client(args.server, **client_options(args))    # ca/cert/key/server_name/token for the Client

The token comes from --token-file, else from the TEXTSERVE_TOKEN environment variable, read
here at the edge. Client certificate flags have no environment fallback on purpose: the
server's TEXTSERVE_TLS_CERT/KEY name the server's own certificate.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from service.cli import CliError

TOKEN_ENV = "TEXTSERVE_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection security")
    group.add_argument(
        "--tls", action="store_true", help="connect with TLS, trusting the system's CA roots"
    )
    group.add_argument(
        "--tls-ca",
        default=os.environ.get("TEXTSERVE_TLS_CA"),
        help="PEM CA bundle to trust for the server's certificate (implies --tls) "
        "[TEXTSERVE_TLS_CA]",
    )
    group.add_argument("--tls-cert", help="PEM client certificate, for mutual TLS")
    group.add_argument("--tls-key", help="PEM private key of --tls-cert")
    group.add_argument(
        "--tls-server-name",
        help="name to check the server's certificate against (default: the host of --server)",
    )
    group.add_argument(
        "--token-file",
        help=f"file holding the bearer token to send (default: ${TOKEN_ENV}, if set)",
    )


def read_token(path: str) -> str:
    from service.config import ConfigError
    from service.security import read_tokens

    try:
        tokens = read_tokens(path, "--token-file")
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if len(tokens) > 1:
        raise CliError(f"--token-file {path} holds {len(tokens)} tokens; a client sends one")
    return tokens[0]


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for service.client.Client from the parsed flags."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise CliError("--tls-cert and --tls-key go together: give both, or neither")
    if args.token_file:
        token: str | None = read_token(args.token_file)
    else:
        token = os.environ.get(TOKEN_ENV, "").strip() or None
    tls = bool(args.tls or args.tls_ca or args.tls_cert)
    if args.tls_server_name and not tls:
        raise CliError("--tls-server-name needs TLS: add --tls or --tls-ca")
    return {
        "tls": tls,
        "ca": args.tls_ca,
        "cert": args.tls_cert,
        "key": args.tls_key,
        "server_name": args.tls_server_name,
        "token": token,
    }
