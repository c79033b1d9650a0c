"""A container health probe: ask the server's gRPC health service, exit 0 only if SERVING.

The Dockerfile's HEALTHCHECK runs ``python -m textserve.commands.probe``; it needs nothing the
serving image lacks (no grpc_health_probe binary to fetch and trust). Use::

    python -m textserve.commands.probe --address 127.0.0.1:50051 [--service NAME] [--timeout 3]
        [--tls-ca ca.pem [--tls-server-name NAME]] [--tls-cert client.pem --tls-key client.key]

Every flag falls back to a TEXTSERVE_PROBE_* environment variable (TEXTSERVE_PROBE_TLS_CA for
--tls-ca, ...), so a container serving TLS gives its fixed HEALTHCHECK the CA (and, for mutual
TLS, a client certificate) through its environment.

Exit status: 0 SERVING, 1 anything else (NOT_SERVING, unknown service, unreachable, timeout),
with one line on stderr saying which.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from typing import Any

from textserve.cli import env_flag, env_switch

DEFAULT_ADDRESS = "127.0.0.1:50051"


def probe(address: str, service: str = "", timeout: float = 3.0, **tls: Any) -> tuple[bool, str]:
    """Check ``service`` ("" = the whole server) at ``address``: (serving?, what was seen).
    ``tls``: tls, ca, cert, key, server_name as textserve.connect.open_channel takes them."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from textserve.connect import open_channel

    with open_channel(address, health_checked=False, **tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            name = code.name if code is not None else "ERROR"
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            return False, f"{address}: {name}: {details}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m textserve.commands.probe", description=__doc__)

    # The image's HEALTHCHECK has fixed arguments: a container that serves TLS tells its probe
    # how to connect through the environment instead (e.g. TEXTSERVE_PROBE_TLS_CA).
    flag = functools.partial(env_flag, parser, "TEXTSERVE_PROBE_")
    flag("address", DEFAULT_ADDRESS, "server HOST:PORT")
    flag("service", "", 'health service name ("" = server)')
    flag("timeout", "3.0", "seconds to wait for a reply", type=float)
    parser.add_argument(
        "--tls",
        action="store_true",
        default=env_switch("TEXTSERVE_PROBE_TLS"),
        help="TLS, trusting the system's roots [TEXTSERVE_PROBE_TLS=1]",
    )
    flag("tls-ca", None, "PEM CA bundle to trust (implies --tls)")
    flag("tls-cert", None, "PEM client certificate (mutual TLS)")
    flag("tls-key", None, "PEM private key of --tls-cert")
    flag("tls-server-name", None, "name the server's certificate must carry")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")
    tls = {
        "tls": bool(args.tls or args.tls_ca or args.tls_cert),
        "ca": args.tls_ca,
        "cert": args.tls_cert,
        "key": args.tls_key,
        "server_name": args.tls_server_name,
    }
    try:
        serving, seen = probe(args.address, args.service, args.timeout, **tls)
    except ValueError as exc:  # unreadable TLS files, or cert without key
        parser.error(str(exc))
    print(seen, file=sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
