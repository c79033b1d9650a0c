"""The decode guard (service/servicers/interceptors.py) with fakes: bytes that are not the
method's protobuf message become a marker, never an exception, and every kind of guarded
method answers them with INVALID_ARGUMENT and an exact message, unary or n-th stream message."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from tests.unit.service.servicers.grpc_fakes import KINDS, Details, FakeContext, serialize
from textserve.service.servicers.interceptors import (
    GuardedRegistrar,
    Undecodable,
    guard,
    safe_deserializer,
)
from textserve.v1 import classifier_pb2 as pb


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


def _registered(handlers: dict[str, Any]) -> Any:
    """Register `handlers` as one generic handler through GuardedRegistrar (as generated code
    does) on a server that keeps it; method -> the handler grpc would get."""
    added: list[Any] = []

    class Server:
        def add_generic_rpc_handlers(self, generic: Any) -> None:
            added.extend(generic)

    GuardedRegistrar(Server()).add_generic_rpc_handlers(  # type: ignore[arg-type]
        [
            grpc.method_handlers_generic_handler(
                "t.S", {k.rsplit("/", 1)[1]: v for k, v in handlers.items()}
            )
        ]
    )
    return lambda method: added[0].service(Details(method))


def test_the_guard_is_built_once_per_method() -> None:
    async def unary(request: Any, context: Any) -> None:
        return None

    handler = grpc.unary_unary_rpc_method_handler(unary, pb.ClassifyRequest.FromString)

    lookup = _registered({"/t.S/U": handler})
    first, again = lookup("/t.S/U"), lookup("/t.S/U")
    assert first is again and first is not handler


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

    lookup = _registered(handlers)

    async def main() -> None:
        assert lookup("/t.S/None") is None
        unary = lookup("/t.S/U")
        assert unary is not None and unary is not handlers["/t.S/U"]
        context = FakeContext()
        assert await unary.unary_unary(unary.request_deserializer(b""), context) == "ok"
        with pytest.raises(grpc.aio.AbortError):
            await unary.unary_unary(unary.request_deserializer(b"\xff\xff"), context)
        assert context.aborted is not None and context.aborted[1].startswith("/t.S/U: the request")
        bidi_guarded = lookup("/t.S/B")

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


def test_a_closed_drain_gate_holds_calls_until_released_and_health_stays_open() -> None:
    from prometheus_client import CollectorRegistry

    from textserve.service.drain import DrainGate
    from textserve.service.metrics import Metrics
    from textserve.service.servicers.interceptors import guard

    async def unary(request: Any, context: Any) -> str:
        return "served"

    handler = grpc.unary_unary_rpc_method_handler(unary, pb.ClassifyRequest.FromString)
    metrics = Metrics(CollectorRegistry())
    gate = DrainGate(metrics)
    served = guard("/t.S/U", handler, gate)
    health = guard("/grpc.health.v1.Health/Check", handler, gate)

    async def main() -> None:
        assert await served.unary_unary(served.request_deserializer(b""), FakeContext()) == "served"
        gate.close()
        held = asyncio.create_task(
            served.unary_unary(served.request_deserializer(b""), FakeContext())
        )
        await asyncio.sleep(0.01)
        assert not held.done() and gate.held == 1  # neither run nor refused: waiting
        # health answers at once (it says NOT_SERVING itself while the server drains)
        assert await health.unary_unary(health.request_deserializer(b""), FakeContext()) == "served"
        gate.release()
        assert await held == "served"
        assert gate.refused == 0
        assert metrics.registry.get_sample_value("textserve_drain_refusals_total") == 0

    asyncio.run(main())


def test_calls_a_drain_cannot_run_are_refused_unavailable_and_counted() -> None:
    from prometheus_client import CollectorRegistry

    from textserve.service.drain import DrainGate
    from textserve.service.metrics import Metrics
    from textserve.service.servicers.interceptors import DRAINING_MESSAGE, guard

    async def unary(request: Any, context: Any) -> str:
        return "served"

    handler = grpc.unary_unary_rpc_method_handler(unary, pb.ClassifyRequest.FromString)
    metrics = Metrics(CollectorRegistry())
    gate = DrainGate(metrics)
    served = guard("/t.S/U", handler, gate)

    async def main() -> None:
        gate.close()
        context = FakeContext()
        # held, then refused: UNAVAILABLE even for a message that did not parse
        held = asyncio.create_task(
            served.unary_unary(served.request_deserializer(b"\xff"), context)
        )
        await asyncio.sleep(0)
        gate.release(serve=False)
        with pytest.raises(grpc.aio.AbortError):
            await held
        assert context.aborted == (grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
        assert (gate.held, gate.refused) == (1, 1)
        assert metrics.registry.get_sample_value("textserve_drain_refusals_total") == 1

    asyncio.run(main())


def test_the_drain_settles_once_calls_stop_coming_or_after_hold_max() -> None:
    import time

    from textserve.service.drain import HOLD_MAX, SETTLE, DrainGate

    async def main() -> None:
        gate = DrainGate()
        gate.close()
        started = time.monotonic()
        await gate.settled(started + 30)  # nobody calls: SETTLE and a step or two
        assert SETTLE <= time.monotonic() - started < SETTLE + 1.0  # (a loaded CI machine)

        gate = DrainGate()
        gate.close()
        started = time.monotonic()

        held: list[asyncio.Task[bool]] = []

        async def caller() -> None:  # an open-loop caller: a new call every 5 ms, never quiet
            while True:
                held.append(asyncio.create_task(gate.hold()))
                await asyncio.sleep(0.005)

        calling = asyncio.create_task(caller())
        await gate.settled(started + 30)
        assert HOLD_MAX <= time.monotonic() - started < HOLD_MAX + 1.0  # not the 30 s deadline
        await gate.settled(time.monotonic())  # a deadline already passed: at once
        calling.cancel()
        gate.release()
        assert all(await asyncio.gather(*held))

    asyncio.run(main())


def test_callers_that_never_go_quiet_are_refused_until_they_stop() -> None:
    """Open-loop callers: after HOLD_MAX the held calls run, new ones are refused at once
    (UNAVAILABLE, counted) and grpc's stop() waits for QUIET seconds without a call."""
    import time

    from prometheus_client import CollectorRegistry

    from textserve.service.drain import QUIET, DrainGate
    from textserve.service.metrics import Metrics

    async def main() -> None:
        metrics = Metrics(CollectorRegistry())
        gate = DrainGate(metrics)
        gate.close()
        held = [asyncio.create_task(gate.hold()) for _ in range(3)]
        await asyncio.sleep(0)
        gate.refuse_new()
        assert await asyncio.gather(*held) == [True, True, True]  # the held calls run
        assert await gate.hold() is False  # a new one is refused at once
        assert gate.refused == 1 and gate.held == 3
        assert metrics.registry.get_sample_value("textserve_drain_refusals_total") == 1
        started = time.monotonic()
        await gate.quiet(started + 30)
        assert QUIET <= time.monotonic() - started < QUIET + 1.0

    asyncio.run(main())
