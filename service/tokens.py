"""Bearer tokens, for every front end: the accepted set and the token a request presents.

    tokens = TokenSet(read_tokens(path))
    token, why_not = bearer_token(metadata)      # gRPC metadata or HTTP headers, as (key, value)
    ok = token is not None and tokens.matches(token)

Tokens are compared in constant time (hmac.compare_digest over SHA-256 digests, against every
token, so neither the position of a match nor the tokens' lengths show in the timing). The gRPC
interceptor (servicers/interceptors.py) and the HTTP app (http/app.py) both use these.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Any

from textserve.connect import AUTHORIZATION, SCHEME


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
