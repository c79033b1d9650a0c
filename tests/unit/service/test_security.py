"""Unit tests of the hardening pieces with fakes: token files and constant-time matching, the
auth interceptor's decisions, TLS file checks, the client flags, the decode guard, and the
batcher's queue reservations (a full queue refuses before tokenizing)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from textserve import connect
from textserve.cli import CliError
from textserve.connect import (
    bearer_metadata,
    channel_credentials,
    parse_tokens,
    read_pem,
    read_tokens,
)
from textserve.service.config import ConfigError, SecurityConfig, ServerConfig
from textserve.service.servicers.interceptors import (
    OPEN_METHODS,
    OPEN_SERVICES,
    DecodeGuard,
    TokenAuthInterceptor,
    TokenSet,
    Undecodable,
    auth_interceptors,
    bearer_token,
    guard,
    refusal_handler,
    safe_deserializer,
)
from textserve.v1 import classifier_pb2 as pb

TOKEN = "s3cret-0123456789abcdef"


# -- tokens ---------------------------------------------------------------------------------------


def test_token_files_skip_blanks_and_comments() -> None:
    text = f"# who: ci\n\n  {TOKEN}  \n# rotated: old\nother-token-0123456789\n"
    assert parse_tokens(text) == [TOKEN, "other-token-0123456789"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no token"),
        ("# only a comment\n\n", "holds no token"),
        ("two words\n", "line 1: a token must be printable ASCII without spaces"),
        ("ok-token\ntöken\n", "line 2: a token must be printable ASCII"),
        ("tab\there\n", "line 1"),
    ],
)
def test_bad_token_files_say_which_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_tokens(text)


def test_unreadable_token_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--auth-token-file .*missing: cannot read"):
        read_tokens(tmp_path / "missing")


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


def test_client_token_metadata_is_checked() -> None:
    assert bearer_metadata(None) == ()
    assert bearer_metadata(f" {TOKEN}\n") == (("authorization", f"Bearer {TOKEN}"),)
    for bad in ("", "two words", "tök"):
        with pytest.raises(ValueError):
            bearer_metadata(bad)


# -- TLS and configuration -------------------------------------------------------------------------


def test_security_config_pairs_its_files() -> None:
    with pytest.raises(ConfigError, match="go together"):
        SecurityConfig(tls_cert=Path("c.pem"))
    with pytest.raises(ConfigError, match="needs TLS itself"):
        SecurityConfig(tls_client_ca=Path("ca.pem"))
    assert SecurityConfig(tls_cert=Path("c"), tls_key=Path("k")).tls
    assert ServerConfig().max_message_bytes == 4 * 1024 * 1024
    with pytest.raises(ConfigError, match="--max-message-bytes"):
        ServerConfig(max_message_bytes=0)


def test_pem_files_are_checked_at_startup(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match=r"--tls-cert .*not a PEM file holding a certificate"):
        read_pem(key, "--tls-cert", "CERTIFICATE")
    assert read_pem(key, "--tls-key", "PRIVATE KEY").startswith(b"-----BEGIN")
    with pytest.raises(ConfigError, match="cannot read"):
        read_pem(tmp_path / "nope.pem", "--tls-ca", "CERTIFICATE")
    with pytest.raises(ValueError, match="give both cert and key"):
        channel_credentials(cert=key)


def _args(**values: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    connect.add_arguments(parser)
    args = parser.parse_args([])
    for name, value in values.items():
        setattr(args, name, value)
    return args


def test_client_flags_read_the_token_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TEXTSERVE_TOKEN", raising=False)
    assert connect.client_options(_args())["token"] is None
    monkeypatch.setenv("TEXTSERVE_TOKEN", TOKEN)
    assert connect.client_options(_args())["token"] == TOKEN
    path = tmp_path / "token"
    path.write_text(f"# mine\n{TOKEN}x\n")
    assert connect.client_options(_args(token_file=str(path)))["token"] == TOKEN + "x"
    path.write_text("one-0123456789abcdef\ntwo-0123456789abcdef\n")
    with pytest.raises(CliError, match="holds 2 tokens; a client sends one"):
        connect.client_options(_args(token_file=str(path)))
    with pytest.raises(CliError, match="go together"):
        connect.client_options(_args(tls_cert="c.pem"))
    with pytest.raises(CliError, match="needs TLS"):
        connect.client_options(_args(tls_server_name="example.com"))
    options = connect.client_options(_args(tls_ca="ca.pem"))
    assert options["tls"] and options["ca"] == "ca.pem"


# -- the decode guard -----------------------------------------------------------------------------


class FakeContext:
    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        self.aborted = (code, message)
        raise grpc.aio.AbortError()


def test_undecodable_bytes_become_a_marker_not_an_exception() -> None:
    deserialize = safe_deserializer(pb.ClassifyRequest.FromString)
    assert list(deserialize(pb.ClassifyRequest(texts=["a"]).SerializeToString()).texts) == ["a"]
    marker = deserialize(b"\x12\x02\xff\xfe")  # texts = invalid UTF-8
    assert isinstance(marker, Undecodable) and "DecodeError" in marker.reason


def test_guarded_unary_and_stream_methods_answer_invalid_argument() -> None:
    calls: list[Any] = []

    async def unary(request: Any, context: Any) -> str:
        calls.append(request)
        return "ok"

    async def bidi(requests: Any, context: Any) -> Any:
        async for request in requests:
            yield request

    async def main() -> None:
        handler = guard(
            "/t.S/U",
            grpc.unary_unary_rpc_method_handler(unary, pb.ClassifyRequest.FromString, None),
        )
        context = FakeContext()
        good = handler.request_deserializer(b"")
        assert await handler.unary_unary(good, context) == "ok"
        bad = handler.request_deserializer(b"\xff\xff")
        with pytest.raises(grpc.aio.AbortError):
            await handler.unary_unary(bad, context)
        assert context.aborted is not None
        assert context.aborted[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert "/t.S/U: the request is not a valid protobuf message" in context.aborted[1]
        assert len(calls) == 1  # the method never saw the bad message

        stream = guard(
            "/t.S/B", grpc.stream_stream_rpc_method_handler(bidi, pb.ClassifyRequest.FromString)
        )

        async def requests() -> Any:
            yield stream.request_deserializer(b"")
            yield stream.request_deserializer(b"\xff\xff")

        context = FakeContext()
        seen = []
        with pytest.raises(grpc.aio.AbortError):
            async for item in stream.stream_stream(requests(), context):
                seen.append(item)
        assert len(seen) == 1 and context.aborted is not None
        assert "message 1 of the request stream" in context.aborted[1]

    asyncio.run(main())


def test_the_guard_is_built_once_per_method() -> None:
    async def unary(request: Any, context: Any) -> None:
        return None

    handler = grpc.unary_unary_rpc_method_handler(unary, pb.ClassifyRequest.FromString)

    async def continuation(details: Any) -> Any:
        return handler

    class Details:
        method = "/t.S/U"
        invocation_metadata = ()

    async def main() -> None:
        interceptor = DecodeGuard()
        first = await interceptor.intercept_service(continuation, Details())  # type: ignore[arg-type]
        again = await interceptor.intercept_service(continuation, Details())  # type: ignore[arg-type]
        assert first is again and first is not handler

    asyncio.run(main())


# -- contracts `make mutate` found unchecked -------------------------------------------------

KINDS = {
    "unary_unary": (grpc.unary_unary_rpc_method_handler, False, False),
    "unary_stream": (grpc.unary_stream_rpc_method_handler, False, True),
    "stream_unary": (grpc.stream_unary_rpc_method_handler, True, False),
    "stream_stream": (grpc.stream_stream_rpc_method_handler, True, True),
}


def serialize(response: Any) -> bytes:
    return b""


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


class Details:
    def __init__(self, method: str, metadata: Any = ()) -> None:
        self.method = method
        self.invocation_metadata = metadata


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


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_of_method_is_guarded_with_an_exact_message(kind: str) -> None:
    make, request_streaming, _ = KINDS[kind]
    seen: list[Any] = []

    if kind == "unary_unary":

        async def behavior(request: Any, context: Any) -> Any:
            assert context is not None
            seen.append(request)
            return "ok"
    elif kind == "unary_stream":

        async def behavior(request: Any, context: Any) -> Any:  # type: ignore[misc]
            assert context is not None
            seen.append(request)
            yield "ok"
    elif kind == "stream_unary":

        async def behavior(requests: Any, context: Any) -> Any:  # type: ignore[misc]
            assert context is not None
            async for request in requests:
                seen.append(request)
            return "ok"
    else:

        async def behavior(requests: Any, context: Any) -> Any:  # type: ignore[misc]
            assert context is not None
            async for request in requests:
                seen.append(request)
                yield "ok"

    handler = guard("/t.S/M", make(behavior, pb.ClassifyRequest.FromString, serialize))
    assert handler.response_serializer is serialize
    assert (handler.request_streaming, handler.response_streaming) == KINDS[kind][1:]
    good = handler.request_deserializer(pb.ClassifyRequest(texts=["a"]).SerializeToString())
    bad = handler.request_deserializer(b"\xff\xff")

    async def call(messages: list[Any]) -> list[Any]:
        context = FakeContext()

        async def stream() -> Any:
            for message in messages:
                yield message

        arg = stream() if request_streaming else messages[0]
        out: list[Any] = []
        try:
            result = getattr(handler, kind)(arg, context)
            if hasattr(result, "__aiter__"):
                out.extend([r async for r in result])
            else:
                out.append(await result)
        except grpc.aio.AbortError:
            out.append(context.aborted)
        return out

    assert asyncio.run(call([good])) == ["ok"]
    assert [list(m.texts) for m in seen] == [["a"]]
    (aborted,) = [x for x in asyncio.run(call([good, bad] if request_streaming else [bad]))
                  if isinstance(x, tuple)]  # fmt: skip
    which = "message 1 of the request stream" if request_streaming else "the request"
    assert aborted[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert aborted[1].startswith(
        f"/t.S/M: {which} is not a valid protobuf message for this method (DecodeError: "
    )


def test_methods_without_a_deserializer_are_left_alone() -> None:
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: None)
    assert guard("/t.S/Raw", handler) is handler


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


def test_the_decode_guard_hands_out_guarded_handlers_with_their_method() -> None:
    contexts: list[Any] = []

    def sync_unary(request: Any, context: Any) -> str:  # a plain function is a valid behaviour
        contexts.append(context)
        return "ok"

    async def bidi(requests: Any, context: Any) -> Any:
        contexts.append(context)
        async for request in requests:
            yield request

    handlers = {
        "/t.S/U": grpc.unary_unary_rpc_method_handler(sync_unary, pb.ClassifyRequest.FromString),
        "/t.S/B": grpc.stream_stream_rpc_method_handler(bidi, pb.ClassifyRequest.FromString),
    }

    async def continuation(details: Any) -> Any:
        return handlers.get(details.method)

    async def main() -> None:
        interceptor = DecodeGuard()
        assert await interceptor.intercept_service(continuation, Details("/t.S/None")) is None  # type: ignore[arg-type]
        unary = await interceptor.intercept_service(continuation, Details("/t.S/U"))  # type: ignore[arg-type]
        assert unary is not None and unary is not handlers["/t.S/U"]
        context = FakeContext()
        assert await unary.unary_unary(unary.request_deserializer(b""), context) == "ok"
        with pytest.raises(grpc.aio.AbortError):
            await unary.unary_unary(unary.request_deserializer(b"\xff\xff"), context)
        assert context.aborted is not None and context.aborted[1].startswith("/t.S/U: the request")
        bidi_guarded = await interceptor.intercept_service(continuation, Details("/t.S/B"))  # type: ignore[arg-type]

        async def requests() -> Any:
            for data in (b"", b"", b"\xff\xff"):
                yield bidi_guarded.request_deserializer(data)

        context = FakeContext()
        with pytest.raises(grpc.aio.AbortError):
            async for _ in bidi_guarded.stream_stream(requests(), context):
                pass
        assert context.aborted is not None
        assert context.aborted[1].startswith("/t.S/B: message 2 of the request stream")
        assert all(c is not None for c in contexts) and len(contexts) == 2

    asyncio.run(main())


def test_a_plain_function_stream_unary_behaviour_is_guarded_too() -> None:
    contexts: list[Any] = []

    def sync_stream_unary(requests: Any, context: Any) -> str:  # a plain function, as for unary
        contexts.append(context)
        return "ok"

    handler = guard(
        "/t.S/SU",
        grpc.stream_unary_rpc_method_handler(sync_stream_unary, pb.ClassifyRequest.FromString),
    )

    async def requests() -> Any:
        yield handler.request_deserializer(b"")

    context = FakeContext()
    assert asyncio.run(handler.stream_unary(requests(), context)) == "ok"
    assert contexts == [context] and context.aborted is None
