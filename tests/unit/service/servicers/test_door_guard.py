"""The door's guard of a unary inference method on a real grpc.aio server
(service/servicers/interceptors.py `_guard_door`): a call past the door is refused before its
message is read or parsed (the cheap refusal: bench/refusal.py), a call let in is parsed once
and answered, and a call without its one message, or with one that does not parse, is
INVALID_ARGUMENT."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry, Counter

from textserve.service.door import COUNT_MESSAGE, Door
from textserve.service.servicers.interceptors import NO_MESSAGE, guard
from textserve.v1 import classifier_pb2 as pb

SERVICE, METHOD = "textserve.v1.Classifier", "Classify"
PATH = f"/{SERVICE}/{METHOD}"


def _serve(door: Door, parsed: list[bytes]) -> Callable[[], Awaitable[tuple[grpc.aio.Server, str]]]:
    def parse(data: bytes) -> pb.ClassifyRequest:
        parsed.append(data)
        return pb.ClassifyRequest.FromString(data)

    async def classify(request: pb.ClassifyRequest, context: Any) -> pb.ClassifyResponse:
        return pb.ClassifyResponse(model=request.texts[0])

    handler = grpc.unary_unary_rpc_method_handler(
        classify, parse, pb.ClassifyResponse.SerializeToString
    )

    async def start() -> tuple[grpc.aio.Server, str]:
        server = grpc.aio.server()
        server.add_registered_method_handlers(SERVICE, {METHOD: guard(PATH, handler, door=door)})
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, f"127.0.0.1:{port}"

    return start


def _run(
    door: Door, parsed: list[bytes], body: Callable[[grpc.aio.Channel], Awaitable[None]]
) -> None:
    async def main() -> None:
        server, address = await _serve(door, parsed)()
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                await body(channel)
        finally:
            await server.stop(None)

    asyncio.run(main())


def _classify(channel: grpc.aio.Channel) -> Any:
    return channel.unary_unary(
        PATH,
        request_serializer=pb.ClassifyRequest.SerializeToString,
        response_deserializer=pb.ClassifyResponse.FromString,
    )


def test_a_call_past_the_door_is_refused_unread_and_counted() -> None:
    refusals = Counter("t_refusals", "", ["method", "limit"], registry=CollectorRegistry())
    door, parsed = Door(ceiling=0, wait=None, refusals=refusals), []

    async def body(channel: grpc.aio.Channel) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _classify(channel)(pb.ClassifyRequest(texts=["a film"]))
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.details() == COUNT_MESSAGE.format(n=0)

    _run(door, parsed, body)
    assert parsed == []  # refused before its message was read: never parsed
    assert (door.arrived, door.refused, door.inflight, door.done) == (1, 1, 0, 0)
    assert refusals.labels(METHOD, "concurrent_requests")._value.get() == 1


def test_a_call_let_in_is_parsed_once_and_answered() -> None:
    door, parsed = Door(ceiling=4, wait=None), []

    async def body(channel: grpc.aio.Channel) -> None:
        answer = await _classify(channel)(pb.ClassifyRequest(texts=["a film"]))
        assert answer.model == "a film"

    _run(door, parsed, body)
    assert len(parsed) == 1
    assert (door.inflight, door.done, door.refused) == (0, 1, 0)


def test_a_call_without_its_message_or_with_a_broken_one_is_invalid_argument() -> None:
    door, parsed = Door(ceiling=4, wait=None), []

    async def nothing() -> AsyncIterator[bytes]:
        return
        yield b""  # pragma: no cover

    async def body(channel: grpc.aio.Channel) -> None:
        # a client that sends no message on a unary method (a stream-unary stub on its path)
        empty = channel.stream_unary(PATH)
        with pytest.raises(grpc.aio.AioRpcError) as none:
            await empty(nothing())
        assert none.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert none.value.details() == f"{PATH}: {NO_MESSAGE}"
        raw = channel.unary_unary(PATH)
        with pytest.raises(grpc.aio.AioRpcError) as broken:
            await raw(b"\xff\xff\xff")
        assert broken.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid protobuf message" in (broken.value.details() or "")

    _run(door, parsed, body)
    assert (door.inflight, door.done) == (0, 2)  # both let in, both out again
