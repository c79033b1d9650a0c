"""The bearer-token interceptor (service/servicers/interceptors.py) with fakes: constant-time
token matching, strict `authorization` metadata parsing, which services and methods are open,
the refusal handler of each method kind, the rate-limited refusal log, and the interceptors
--auth-token-file builds."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.unit.service.servicers.grpc_fakes import KINDS, Details, FakeContext, serialize
from textserve.connect import bearer_metadata
from textserve.service.config import SecurityConfig
from textserve.service.servicers.interceptors import (
    OPEN_METHODS,
    OPEN_SERVICES,
    TokenAuthInterceptor,
    auth_interceptors,
    refusal_handler,
)
from textserve.service.tokens import TokenSet, bearer_token
from textserve.v1 import classifier_pb2 as pb

TOKEN = "s3cret-0123456789abcdef"


def test_every_token_matches_and_nothing_else() -> None:
    tokens = TokenSet([TOKEN, "second-0123456789abcdef"])
    assert tokens.matches(TOKEN) and tokens.matches("second-0123456789abcdef")
    for wrong in ("", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), "second", TOKEN.encode() + b"\0"):
        assert not tokens.matches(wrong)
    with pytest.raises(ValueError):
        TokenSet([])


@pytest.mark.parametrize(
    ("metadata", "token", "problem"),
    [
        ((("authorization", f"Bearer {TOKEN}"),), TOKEN, ""),
        ((("Authorization", f"bearer   {TOKEN}  "),), TOKEN, ""),
        ((("other", "x"),), None, "missing credentials"),
        (None, None, "missing credentials"),
        ((("authorization", TOKEN),), None, "must be 'Bearer <token>'"),
        ((("authorization", "Bearer "),), None, "must be 'Bearer <token>'"),
        ((("authorization", f"Basic {TOKEN}"),), None, "must be 'Bearer <token>'"),
        ((("authorization", "Bearer a"), ("authorization", "Bearer b")), None, "not several"),
    ],
)
def test_bearer_metadata_is_parsed_strictly(metadata: Any, token: str | None, problem: str) -> None:
    got, why = bearer_token(metadata)
    assert got == token and problem in why


def test_the_interceptor_leaves_health_and_reflection_open() -> None:
    interceptor = TokenAuthInterceptor([TOKEN])
    for service in OPEN_SERVICES:
        assert interceptor.check(f"/{service}/Check", ()) == ""
    assert "missing" in interceptor.check("/textserve.v1.Classifier/Classify", ())
    assert "missing" in interceptor.check("/inference.GRPCInferenceService/ModelInfer", ())
    assert interceptor.check("/textserve.v1.Classifier/Classify", bearer_metadata(TOKEN)) == ""
    wrong = bearer_metadata("wrong-0123456789abcdef")
    assert interceptor.check("/textserve.v1.Classifier/Classify", wrong) == "invalid bearer token"
    # a look-alike service name is not open
    assert interceptor.check("/grpc.health.v1.HealthX/Check", ()) != ""
    # the Open Inference Protocol's liveness and readiness probes are open, nothing else of it
    for method in OPEN_METHODS:
        assert interceptor.check(method, ()) == ""
    for rpc in ("ModelReady", "ServerMetadata", "ServerLiveX"):
        assert "missing" in interceptor.check(f"/inference.GRPCInferenceService/{rpc}", ())


def test_refusals_are_logged_at_most_every_ten_seconds(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    interceptor = TokenAuthInterceptor([TOKEN], clock=lambda: now[0])
    for _ in range(5):
        interceptor._note_refusal("/x.Y/Z", "missing credentials")
    now[0] += 10
    interceptor._note_refusal("/x.Y/Z", "invalid bearer token")
    lines = [r.getMessage() for r in caplog.records if "unauthenticated" in r.getMessage()]
    assert len(lines) == 2 and lines[1].startswith("refused 5 unauthenticated")
    assert TOKEN not in caplog.text


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_refusal_is_a_handler_of_the_same_kind_that_reads_nothing(kind: str) -> None:
    make, request_streaming, response_streaming = KINDS[kind]

    async def behavior(request: Any, context: Any) -> None:
        raise AssertionError("the refused method ran")

    handler = make(behavior, pb.ClassifyRequest.FromString, serialize)
    refusal = refusal_handler(handler, grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token")
    assert (refusal.request_streaming, refusal.response_streaming) == (
        request_streaming,
        response_streaming,
    )
    assert refusal.request_deserializer is None and refusal.response_serializer is serialize
    context = FakeContext()
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(getattr(refusal, kind)(None, context))
    assert context.aborted == (grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token")


def test_the_interceptor_refuses_with_the_reason_and_logs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def unary(request: Any, context: Any) -> str:
        return "ok"

    handler = grpc.unary_unary_rpc_method_handler(unary, pb.ClassifyRequest.FromString)

    async def continuation(details: Any) -> Any:
        return None if details.method.endswith("/Missing") else handler

    async def main() -> None:
        interceptor = TokenAuthInterceptor(["s3cret"], clock=lambda: 100.0)
        intercept = interceptor.intercept_service
        good = Details("/textserve.v1.Classifier/Classify", (("authorization", "Bearer s3cret"),))
        assert await intercept(continuation, good) is handler  # type: ignore[arg-type]
        assert await intercept(continuation, Details("/x.Y/Missing")) is None  # type: ignore[arg-type]
        bad = Details("/textserve.v1.Classifier/Classify", (("authorization", "Bearer nope"),))
        refusal = await intercept(continuation, bad)  # type: ignore[arg-type]
        assert refusal is not handler and refusal.request_deserializer is None
        context = FakeContext()
        with pytest.raises(grpc.aio.AbortError):
            await refusal.unary_unary(None, context)
        assert context.aborted == (grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token")

    asyncio.run(main())
    assert [r.getMessage() for r in caplog.records] == [
        "refused 1 unauthenticated call(s) (latest: /textserve.v1.Classifier/Classify: "
        "invalid bearer token)"
    ]


def test_auth_interceptors_follow_the_token_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert auth_interceptors(SecurityConfig()) == []
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("one\ntwo\n")
    with caplog.at_level("INFO"):
        (interceptor,) = auth_interceptors(SecurityConfig(auth_token_file=tokens))
    assert isinstance(interceptor, TokenAuthInterceptor)
    assert interceptor.check("/x.Y/Z", (("authorization", "Bearer two"),)) == ""
    assert interceptor.check("/x.Y/Z", (("authorization", "Bearer three"),)) != ""
    assert "bearer-token authentication on (2 token(s))" in [r.getMessage() for r in caplog.records]


def test_open_services_and_methods_need_no_token() -> None:
    interceptor = TokenAuthInterceptor(["t"])
    for method in (
        "/grpc.health.v1.Health/Check",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "/inference.GRPCInferenceService/ServerLive",
        "/inference.GRPCInferenceService/ServerReady",
    ):
        assert interceptor.check(method, ()) == "", method
    for method in (
        "/inference.GRPCInferenceService/ModelReady",
        "/textserve.v1.Admin/LoadModel",
        "Health",  # not a method path: no service
    ):
        assert interceptor.check(method, ()).startswith("missing credentials"), method


def test_token_details_exact() -> None:
    with pytest.raises(ValueError, match=r"^a TokenSet needs at least one token$"):
        TokenSet([])
    # a token file's undecodable bytes come as surrogates: they still compare, never raise
    assert TokenSet(["t\udcff"]).matches("t\udcff") and not TokenSet(["t"]).matches("t\udcff")
    assert bearer_token([("authorization", b"Bearer t\xe9")]) == ("t\xe9", "")  # latin-1 bytes
    assert bearer_token([("authorization", "Bearer t")]) == ("t", "")
    assert bearer_token([]) == (
        None,
        "missing credentials: this server needs 'authorization: Bearer <token>' metadata",
    )
    both = [("authorization", "Bearer a"), ("authorization", "Bearer b")]
    assert bearer_token(both) == (None, "send one authorization metadata entry, not several")
    assert bearer_token([("authorization", "Basic a")]) == (
        None,
        "authorization metadata must be 'Bearer <token>'",
    )


def test_the_first_refusal_is_logged_whatever_the_clock(caplog: pytest.LogCaptureFixture) -> None:
    interceptor = TokenAuthInterceptor(["t"], clock=lambda: 0.0)
    interceptor._note_refusal("/x.Y/Z", "invalid bearer token")
    assert len(caplog.records) == 1
