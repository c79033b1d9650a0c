"""Transport security and authentication: TLS / mutual TLS credentials and bearer tokens.

Server side (create_server uses these)::

    credentials = server_credentials(config.security)   # None: plaintext
    interceptors = auth_interceptors(config.security)   # [TokenAuthInterceptor] or []

Client side (service.client, the CLI, the health probe)::

    channel = open_channel("host:50051", ca="ca.pem", cert="client.pem", key="client.key")
    stub.Classify(request, metadata=bearer_metadata(token))

Tokens are compared in constant time (hmac.compare_digest over SHA-256 digests, against every
token, so neither the position of a match nor the tokens' lengths show in the timing). The
health and reflection services, and the Open Inference Protocol's ServerLive/ServerReady, stay
open so that probes and tools work without a token.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc

from service.config import ConfigError, SecurityConfig

logger = logging.getLogger(__name__)

# Services answered without a token: orchestrator probes (health) and tools (reflection).
OPEN_SERVICES: frozenset[str] = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)
# Single methods answered without a token: the Open Inference Protocol's liveness and
# readiness probes (what KServe's and Triton's orchestration call; they reveal nothing but
# "up"). Everything else of that service, ModelReady and metadata included, needs a token.
OPEN_METHODS: frozenset[str] = frozenset(
    {
        "/inference.GRPCInferenceService/ServerLive",
        "/inference.GRPCInferenceService/ServerReady",
    }
)
AUTHORIZATION = "authorization"  # gRPC metadata keys are lowercase (HTTP/2 headers)
SCHEME = "bearer"
MIN_TOKEN_LENGTH = 16  # shorter tokens are accepted with a warning: guessable
_LOG_EVERY = 10.0  # seconds between log lines about refused calls (a flood must not flood logs)

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


def _digest(token: str | bytes) -> bytes:
    data = token.encode("utf-8", "surrogateescape") if isinstance(token, str) else token
    return hashlib.sha256(data).digest()


class TokenSet:
    """Accepted bearer tokens; `matches` takes the same time whichever token (if any) matches."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self._digests = [_digest(t) for t in tokens]
        if not self._digests:
            raise ValueError("a TokenSet needs at least one token")

    def matches(self, presented: str | bytes) -> bool:
        digest = _digest(presented)
        matched = False
        for expected in self._digests:  # no early exit: every token is compared
            matched |= hmac.compare_digest(digest, expected)
        return matched


def bearer_token(metadata: Iterable[tuple[str, Any]] | None) -> tuple[str | None, str]:
    """(token, "") from `authorization: Bearer <token>` metadata, else (None, why not)."""
    values = [value for key, value in metadata or () if key.lower() == AUTHORIZATION]
    if not values:
        return None, (
            "missing credentials: this server needs 'authorization: Bearer <token>' metadata"
        )
    if len(values) > 1:
        return None, "send one authorization metadata entry, not several"
    value = values[0].decode("latin-1") if isinstance(values[0], bytes) else str(values[0])
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != SCHEME or not token.strip():
        return None, "authorization metadata must be 'Bearer <token>'"
    return token.strip(), ""


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying `token` (empty when None), for every call of a client."""
    if token is None:
        return ()
    token = token.strip()
    if not token or not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError("a bearer token must be non-empty printable ASCII without spaces")
    return ((AUTHORIZATION, f"Bearer {token}"),)


# -- the server's interceptor ---------------------------------------------------------------------


def _service_of(method: str) -> str:
    """The service of a method path: /pkg.Service/Method -> pkg.Service."""
    return method.rsplit("/", 2)[-2] if method.count("/") >= 2 else ""


def refusal_handler(
    handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str
) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that answers `code` without reading the request
    (no deserializer: a refused request costs no parsing)."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    serializer = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, None, serializer)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, None, serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, None, serializer)
    return grpc.unary_unary_rpc_method_handler(refuse, None, serializer)


Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for calls without a valid bearer token, except to `open_services` and
    `open_methods`."""

    def __init__(
        self,
        tokens: Iterable[str],
        open_services: Iterable[str] = OPEN_SERVICES,
        clock: Callable[[], float] = time.monotonic,
        open_methods: Iterable[str] = OPEN_METHODS,
    ) -> None:
        self._tokens = TokenSet(tokens)
        self._open = frozenset(open_services)
        self._open_methods = frozenset(open_methods)
        self._clock = clock
        self._refused = 0  # since the last log line
        self._logged_at = -_LOG_EVERY

    def check(self, method: str, metadata: Iterable[tuple[str, Any]] | None) -> str:
        """The empty string when the call may go on, else the message to refuse it with."""
        if method in self._open_methods or _service_of(method) in self._open:
            return ""
        token, problem = bearer_token(metadata)
        if token is None:
            return problem
        return "" if self._tokens.matches(token) else "invalid bearer token"

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        details = handler_call_details
        problem = self.check(details.method, details.invocation_metadata)
        handler = await continuation(details)
        if not problem or handler is None:
            return handler
        self._note_refusal(details.method, problem)
        return refusal_handler(handler, grpc.StatusCode.UNAUTHENTICATED, problem)

    def _note_refusal(self, method: str, problem: str) -> None:
        self._refused += 1
        now = self._clock()
        if now - self._logged_at >= _LOG_EVERY:
            logger.warning(
                "refused %d unauthenticated call(s) (latest: %s: %s)",
                self._refused, method, problem,
            )  # fmt: skip
            self._refused, self._logged_at = 0, now


def auth_interceptors(security: SecurityConfig) -> list[grpc.aio.ServerInterceptor]:
    """The interceptors `security` asks for (reads the token file)."""
    if security.auth_token_file is None:
        return []
    tokens = read_tokens(security.auth_token_file)
    logger.info("bearer-token authentication on (%d token(s))", len(tokens))
    return [TokenAuthInterceptor(tokens)]


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


def channel_credentials(
    ca: PathLike | None = None, cert: PathLike | None = None, key: PathLike | None = None
) -> grpc.ChannelCredentials:
    """Client TLS credentials: trust `ca` (None: the system's roots); present `cert`/`key`
    (both or neither) to a server that asks for a client certificate."""
    if (cert is None) != (key is None):
        raise ValueError("a client certificate needs its key: give both cert and key, or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=None if ca is None else read_pem(ca, "--tls-ca", "CERTIFICATE"),
        private_key=None if key is None else read_pem(key, "--tls-key", "PRIVATE KEY"),
        certificate_chain=None if cert is None else read_pem(cert, "--tls-cert", "CERTIFICATE"),
    )


def open_channel(
    target: str,
    *,
    tls: bool = False,
    ca: PathLike | None = None,
    cert: PathLike | None = None,
    key: PathLike | None = None,
    server_name: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
    aio: bool = False,
) -> Any:
    """A channel to `target`: TLS when `tls` or any of ca/cert/key is given, else plaintext.
    `server_name` overrides the name checked against the server's certificate (e.g. when
    dialling 127.0.0.1 a server whose certificate names its DNS name). `aio`: a grpc.aio one."""
    opts = list(options)
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
