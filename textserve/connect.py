"""Connecting to a textserve server: channels (plaintext, TLS, mutual TLS), bearer tokens, and
the connection flags of the client subcommands. The client side only: nothing here imports the
server.

    channel = open_channel("host:50051", ca="ca.pem", cert="client.pem", key="client.key")
    stub.Classify(request, metadata=bearer_metadata(token))

    open_channel("dns:///textserve-grpc.textserve.svc:50051")   # every pod of a headless Service
    open_channel("10.0.0.5:50051,10.0.0.6:50051")                # or ["10.0.0.5:50051", ...]

Every channel balances per request with gRPC's `round_robin` over all the addresses its
target resolves to (a ClusterIP Service would pin the one HTTP/2 connection to one pod), and
retries UNAVAILABLE (a replica that stopped or drains before the call reached it) and
RESOURCE_EXHAUSTED (a server that admits no more work now), with backoff (the
textserve.v1 reads and Classify are idempotent): SERVICE_CONFIG.

    add_arguments(parser)                          # --tls, --tls-ca, --tls-cert, --tls-key, ...
    Client(args.server, **client_options(args))    # ca/cert/key/server_name/token for the Client

The token comes from --token-file, else from the TEXTSERVE_TOKEN environment variable, read
here at the edge. Client certificate flags have no environment fallback on purpose: the
server's TEXTSERVE_TLS_CERT/KEY name the server's own certificate. The server reads its token
file and PEM files with the same functions (parse_tokens, read_tokens, read_pem).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from textserve.cli import CliError, ConfigError, env_flag

logger = logging.getLogger(__name__)

AUTHORIZATION = "authorization"  # gRPC metadata keys are lowercase (HTTP/2 headers)
SCHEME = "bearer"
MIN_TOKEN_LENGTH = 16  # shorter tokens are accepted with a warning: guessable

PathLike = str | Path


# -- tokens ---------------------------------------------------------------------------------------


def parse_tokens(text: str, source: str = "token file") -> list[str]:
    """Tokens from a token file's text: one per line; blank lines and `#` comments skipped.

    >>> parse_tokens("# ops\\ns3cr3t-0123456789abcdef\\n\\n")
    ['s3cr3t-0123456789abcdef']
    """
    tokens = []
    for number, line in enumerate(text.splitlines(), start=1):
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
            raise ConfigError(
                f"{source} line {number}: a token must be printable ASCII without spaces "
                "(it travels as 'authorization: Bearer <token>' metadata)"
            )
        tokens.append(token)
    if not tokens:
        raise ConfigError(f"{source} holds no token: put one token per line")
    return tokens


def read_tokens(path: PathLike, flag: str = "--auth-token-file") -> list[str]:
    """The tokens of a token file; ConfigError naming `flag` when it cannot be used."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{flag} {path}: cannot read it ({exc})") from None
    tokens = parse_tokens(text, f"{flag} {path}")
    if any(len(t) < MIN_TOKEN_LENGTH for t in tokens):
        logger.warning(
            "%s %s has tokens shorter than %d characters: easy to guess",
            flag, path, MIN_TOKEN_LENGTH,
        )  # fmt: skip
    return tokens


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying `token` (empty when None), for every call of a client."""
    if token is None:
        return ()
    token = token.strip()
    if not token or not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError("a bearer token must be non-empty printable ASCII without spaces")
    return ((AUTHORIZATION, f"Bearer {token}"),)


# -- TLS ------------------------------------------------------------------------------------------


def read_pem(path: PathLike, flag: str, kind: str) -> bytes:
    """A PEM file's bytes, checked to hold a `kind` block ("CERTIFICATE", "PRIVATE KEY"):
    grpc only finds a bad file at the first handshake, we want it at startup."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot read it ({exc.strerror})") from None
    if b"-----BEGIN " not in data or f"{kind}-----".encode() not in data:
        raise ConfigError(f"{flag} {path}: not a PEM file holding a {kind.lower()}")
    return data


def channel_credentials(
    ca: PathLike | None = None, cert: PathLike | None = None, key: PathLike | None = None
) -> Any:
    """Client TLS credentials: trust `ca` (None: the system's roots); present `cert`/`key`
    (both or neither) to a server that asks for a client certificate."""
    import grpc

    if (cert is None) != (key is None):
        raise ValueError("a client certificate needs its key: give both cert and key, or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=None if ca is None else read_pem(ca, "--tls-ca", "CERTIFICATE"),
        private_key=None if key is None else read_pem(key, "--tls-key", "PRIVATE KEY"),
        certificate_chain=None if cert is None else read_pem(cert, "--tls-cert", "CERTIFICATE"),
    )


# -- balancing ------------------------------------------------------------------------------------

# Per-request balancing over every address of the target, and transparent retries of calls
# that no replica could take (UNAVAILABLE: connection refused or reset, a draining server's
# GOAWAY; CANCELLED: a server that shuts down cancels the calls it had received but not yet
# started — seen under load at a replica's SIGTERM; a call the caller cancels itself is never
# retried; RESOURCE_EXHAUSTED: a server whose queue holds more work than it admits, which
# refused the call before running any of it, or one whose queue is full). Classify is
# idempotent (no state changes), so a retried call cannot classify twice in any way that
# matters; streams are left out (their messages are not replayable). A call is tried 5 times
# at most, backing off 0.05 s to 1 s: a refused call costs the server little (the limiter
# answers before any handler runs). No retryThrottling (gRPC A6): with it, the burst of
# UNAVAILABLE when a worker is killed spent the token bucket and the calls in flight on it
# reached the caller as errors instead of moving to the other worker. The one
# RESOURCE_EXHAUSTED a retry cannot cure, a request over the server's message size limit,
# costs the 5 attempts' backoff (~1.5 s) before it fails.
# Client-side health checking (gRPC A17, `healthCheckConfig`) where a target balances over
# several replicas: each connection watches grpc.health.v1 and round_robin picks only SERVING
# replicas, so one that is warming up after a restart, or draining after SIGTERM (NOT_SERVING
# at once), gets no new calls. Not for one address (there is no other replica to pick, and
# the server's own answer — e.g. "no model is served" — says more than "backend unhealthy"),
# nor for the health probe and the admin client, which must reach a NOT_SERVING server.
RETRIED_METHODS = ("Classify", "Rerank", "ZeroShot", "Tag", "ListModels", "GetModel")
SERVICE_CONFIG: dict[str, Any] = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [
        {
            "name": [{"service": "textserve.v1.Classifier", "method": m} for m in RETRIED_METHODS],
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.05s",
                "maxBackoff": "1s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED", "RESOURCE_EXHAUSTED"],
            },
        }
    ],
}
HEALTH_CHECKED_SERVICE_CONFIG: dict[str, Any] = {
    **SERVICE_CONFIG,
    "healthCheckConfig": {"serviceName": ""},
}
_RETRY_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.enable_retries", 1),
    # a replica that restarts (rollout, SIGTERM then back) gets traffic again within seconds,
    # not after gRPC's default backoff of up to two minutes
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
)
BALANCING_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
    *_RETRY_OPTIONS,
)
HEALTH_CHECKED_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.service_config", json.dumps(HEALTH_CHECKED_SERVICE_CONFIG)),
    *_RETRY_OPTIONS,
)


def channel_target(target: str | Sequence[str]) -> tuple[str, list[tuple[str, Any]]]:
    """The gRPC target URI for `target` and the channel options it needs besides
    BALANCING_OPTIONS: one address (HOST:PORT, or a URI such as dns:///name:port) as is;
    several (a list, or one string with commas) as one `ipv4:`/`ipv6:` URI, host names
    resolved now (use dns:/// to follow a name whose addresses change).

    >>> channel_target("127.0.0.1:1,127.0.0.1:2")
    ('ipv4:127.0.0.1:1,127.0.0.1:2', [])
    >>> channel_target("dns:///textserve-grpc:50051")
    ('dns:///textserve-grpc:50051', [])
    """
    addresses = [target] if isinstance(target, str) else list(target)
    addresses = [a.strip() for item in addresses for a in item.split(",") if a.strip()]
    if not addresses:
        raise ConfigError("no server address given")
    if len(addresses) == 1:
        return addresses[0], []
    if any("://" in a or a.startswith(("ipv4:", "ipv6:", "unix:")) for a in addresses):
        raise ConfigError(
            f"several addresses must each be HOST:PORT, got {', '.join(addresses)} "
            "(for a name with many addresses give the one dns:///NAME:PORT)"
        )
    resolved = [ip for a in addresses for ip in _resolve(a)]
    families = {":" in ip.rpartition(":")[0] for ip in resolved}
    if len(families) > 1:
        raise ConfigError(f"mix of IPv4 and IPv6 addresses: {', '.join(resolved)}")
    scheme = "ipv6" if families == {True} else "ipv4"
    options: list[tuple[str, Any]] = []
    first_host = addresses[0].rpartition(":")[0].strip("[]")
    if not _is_ip(first_host):  # TLS checks the certificate against the name, not an address
        options.append(("grpc.default_authority", addresses[0]))
    return f"{scheme}:{','.join(resolved)}", options


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _resolve(address: str) -> list[str]:
    host, sep, port = address.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not host:
        raise ConfigError(f"server address {address!r} is not HOST:PORT")
    host = host.strip("[]")
    if _is_ip(host):
        return [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"cannot resolve {host!r}: {exc}") from None
    ips = dict.fromkeys(str(info[4][0]) for info in infos)
    return [f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in ips]


def open_channel(
    target: str | Sequence[str],
    *,
    tls: bool = False,
    ca: PathLike | None = None,
    cert: PathLike | None = None,
    key: PathLike | None = None,
    server_name: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
    aio: bool = False,
    health_checked: bool | None = None,
) -> Any:
    """A channel to `target`: TLS when `tls` or any of ca/cert/key is given, else plaintext.
    `server_name` overrides the name checked against the server's certificate (e.g. when
    dialling 127.0.0.1 a server whose certificate names its DNS name). `aio`: a grpc.aio one.
    `target`: one address or URI, or several addresses (see channel_target); the channel
    balances per request (round_robin) and retries UNAVAILABLE (SERVICE_CONFIG).
    `health_checked` (default: when the target balances over several replicas: several
    addresses or a dns:/// name) picks only replicas whose grpc.health.v1 status is SERVING."""
    import grpc  # here: `textserve --help` and the flag helpers stay instant

    uri, extra = channel_target(target)
    target = uri
    if health_checked is None:
        health_checked = uri.startswith(("ipv4:", "ipv6:", "dns:"))
    balancing = HEALTH_CHECKED_OPTIONS if health_checked else BALANCING_OPTIONS
    opts = [*balancing, *extra, *options]
    if not (tls or ca or cert or key):
        if server_name:
            raise ValueError("server_name only applies to TLS: give tls=True or a CA")
        return (grpc.aio.insecure_channel if aio else grpc.insecure_channel)(target, options=opts)
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    credentials = channel_credentials(ca, cert, key)
    return (grpc.aio.secure_channel if aio else grpc.secure_channel)(
        target, credentials, options=opts
    )


# -- the client subcommands' flags -----------------------------------------------------------

TOKEN_ENV = "TEXTSERVE_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection security")
    group.add_argument(
        "--tls", action="store_true", help="connect with TLS, trusting the system's CA roots"
    )
    env_flag(group, "TEXTSERVE_", "tls-ca", None,
             "PEM CA bundle to trust for the server's certificate (implies --tls)")  # fmt: skip
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
    try:
        tokens = read_tokens(path, "--token-file")
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if len(tokens) > 1:
        raise CliError(f"--token-file {path} holds {len(tokens)} tokens; a client sends one")
    return tokens[0]


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for textserve.client.Client from the parsed flags."""
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
