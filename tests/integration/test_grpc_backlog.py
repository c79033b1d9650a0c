"""Calls grpc holds for a busy event loop are answered by the server, never cancelled by grpc.

grpc.aio takes calls from grpc core one at a time per method; while the server's event loop is
busy (here: blocked for BLOCK s, as a hot reload or a load generator on the same cores slows
it), what arrives waits in grpc core. grpcio 1.85 cancels such calls itself past 1,000 held
(`grpc.server.max_pending_requests`, a random early drop up to 3,000): its callers see
CANCELLED, which nobody retries, and no handler, metric or log line sees them. The server
raises grpc's cap to a memory bound and refuses, RESOURCE_EXHAUSTED (retryable, counted), the
calls that waited in grpc longer than --max-backlog-wait-ms (service/backlog.py).

A real server (create_server on 127.0.0.1:0) and real grpc.aio clients over four connections
(the soak's load generator in miniature), in a thread of their own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from tests.serving import RunningServer, running_server
from textserve.service.backlog import REFUSAL_MESSAGE
from textserve.service.config import ServerConfig
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

CALLS = 3000  # arriving while the loop is blocked: over grpc's default cap of 1,000 held calls
BLOCK = 3.5  # seconds the server's event loop is blocked (time.sleep: the client still runs)
CONNECTIONS = 4
AFTER = 20  # calls sent one after another once every call above is answered


def _refusals(srv: RunningServer) -> dict[str, float]:
    """textserve_backlog_refusals_total by bound (0 where none)."""
    value = srv.metrics.registry.get_sample_value
    return {
        bound: value("textserve_backlog_refusals_total", {"bound": bound}) or 0.0
        for bound in ("max_wait", "target")
    }


Send = Callable[[Callable[[int], Awaitable[None]]], Awaitable[None]]


def _run_client(srv: RunningServer, send: Send) -> tuple[Counter[str], set[str]]:
    """grpc.aio clients over CONNECTIONS connections (each warmed up), in a thread of their
    own: `send(one)` sends calls with `one(i)`; the status of each and the distinct messages."""
    codes: Counter[str] = Counter()
    messages: set[str] = set()

    async def client() -> None:
        channels = [
            grpc.aio.insecure_channel(srv.address, options=[("backlog.test", i)])
            for i in range(CONNECTIONS)
        ]
        stubs = [pb_grpc.ClassifierStub(channel) for channel in channels]
        for stub in stubs:  # connected before the loop blocks
            await stub.Classify(pb.ClassifyRequest(texts=["warm"]), timeout=30)

        async def one(i: int) -> None:
            try:
                request = pb.ClassifyRequest(texts=["a good film"])
                await stubs[i % CONNECTIONS].Classify(request, timeout=60)
                codes["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] += 1
                messages.add(exc.details() or "")

        await send(one)
        for channel in channels:
            await channel.close()

    thread = threading.Thread(target=lambda: asyncio.run(client()), daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    return codes, messages


def _send_while_blocked(
    srv: RunningServer, calls: int = CALLS, block: float = BLOCK, after: int = AFTER
) -> tuple[Counter[str], list[str]]:
    """Block the server's loop for `block` s, send `calls` calls meanwhile, wait for every
    answer, then send `after` calls one by one: the status of each (and the distinct messages)."""

    async def send(one: Callable[[int], Awaitable[None]]) -> None:
        srv.loop.call_soon_threadsafe(time.sleep, block)  # the server's loop: busy
        await asyncio.gather(*(one(i) for i in range(calls)))
        for i in range(after):  # the loop free again: nothing waits, nothing is refused
            await one(i)

    codes, messages = _run_client(srv, send)
    return codes, sorted(messages)


def test_calls_held_for_a_busy_loop_are_refused_by_age_never_cancelled(
    tiny_repository: Path,
) -> None:
    with running_server(tiny_repository) as srv:  # --max-backlog-wait-ms 2000, the default
        codes, messages = _send_while_blocked(srv)
        refused = _refusals(srv)["max_wait"]
        assert srv.server.backlog.in_app == 0  # every call the guard ran is counted out
    print(f"\n{CALLS} calls during a {BLOCK:g} s block: {dict(codes)}; {messages}")
    assert codes["CANCELLED"] == 0, (codes, messages)
    assert sum(codes.values()) == CALLS + AFTER
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, (codes, messages)
    # the calls that waited longer than the bound are refused, retryable, and counted; the
    # server takes calls again at once (no call refused that did not wait)
    assert refused is not None and 0 < refused <= CALLS
    assert REFUSAL_MESSAGE.format(ms=ServerConfig().max_backlog_wait * 1e3) in messages
    assert codes["OK"] >= AFTER


def test_with_refusal_by_age_off_grpc_still_cancels_none(tiny_repository: Path) -> None:
    """grpc's own cap is what cancelled: off by age, the held calls are all taken and answered
    (served, or refused by --max-concurrent-rpcs), none CANCELLED."""
    with running_server(tiny_repository, max_backlog_wait=None) as srv:
        codes, messages = _send_while_blocked(srv)
        refused = sum(_refusals(srv).values())
    print(f"\n{CALLS} calls during a {BLOCK:g} s block, no refusal by age: {dict(codes)}")
    assert codes["CANCELLED"] == 0, (codes, messages)
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, (codes, messages)
    assert refused == 0


def _arriving_during_a_block(
    srv: RunningServer, block: float = 2.5
) -> tuple[Counter[str], set[str]]:
    """Calls arriving steadily (40 every 50 ms) while the loop is blocked for `block` s: a
    backlog that stands longer than a second, its calls of every age up to `block`."""

    async def send(one: Callable[[int], Awaitable[None]]) -> None:
        srv.loop.call_soon_threadsafe(time.sleep, block)
        calls: list[asyncio.Future[None]] = []
        for tick in range(round(block / 0.05)):
            calls.extend(asyncio.ensure_future(one(tick * 40 + i)) for i in range(40))
            await asyncio.sleep(0.05)
        await asyncio.gather(*calls)

    return _run_client(srv, send)


def test_a_standing_backlog_is_shed_down_to_the_target(tiny_repository: Path) -> None:
    """A backlog older than --backlog-target-ms (100) for over a second, of calls arriving at
    800/s to a server that has served a handful, is overload, not a stall: its calls older than
    the target are refused as they are taken (the 100 ms message), not only those older than
    --max-backlog-wait-ms (2 s)."""
    with running_server(tiny_repository) as srv:
        codes, messages = _arriving_during_a_block(srv)
        refused = _refusals(srv)
    print(f"\nsteady arrivals during a 2.5 s block: {dict(codes)}; {sorted(messages)}")
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, (codes, messages)
    assert REFUSAL_MESSAGE.format(ms=100) in messages
    assert codes["RESOURCE_EXHAUSTED"] > 0.6 * sum(codes.values())
    assert 0 < refused["target"] <= sum(refused.values()) <= codes["RESOURCE_EXHAUSTED"]

    with running_server(tiny_repository, backlog_target=None) as srv:  # the age bound only
        codes, messages = _arriving_during_a_block(srv)
        refused = _refusals(srv)
    print(f"the same, --backlog-target-ms 0: {dict(codes)}; {sorted(messages)}")
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, (codes, messages)
    # only calls older than 2 s refused (how many depends on how fast the loop drains after
    # the block: 490-1,200 of 2,000 measured, the more the busier the machine)
    assert messages <= {REFUSAL_MESSAGE.format(ms=2000)}
    assert refused["target"] == 0 and codes["OK"] > 0


FLOOD = 14_000  # calls during a longer block: past PENDING_CAP (10,000) if grpc held them all
FLOOD_BLOCK = 6.0


def test_a_flood_past_grpcs_cap_is_held_by_the_clients_never_cancelled(
    tiny_repository: Path,
) -> None:
    """More calls than grpc core holds without cancelling (PENDING_CAP), sent over a few
    connections while the loop is stuck: with --max-streams-per-connection (1,024, the
    default) each connection has at most that many open, the clients hold the rest, and every
    call ends OK or refused retryably — RESOURCE_EXHAUSTED by age, or UNAVAILABLE with
    REFUSED_STREAM for one sent past the limit (it never ran). With no limit, grpc cancels
    what it holds past its cap: the hazard the limit is for."""
    with running_server(tiny_repository) as srv:
        codes, messages = _send_while_blocked(srv, FLOOD, FLOOD_BLOCK, after=0)
    print(f"\n{FLOOD} calls during a {FLOOD_BLOCK:g} s block: {dict(codes)}; {sorted(messages)}")
    assert sum(codes.values()) == FLOOD
    assert codes["CANCELLED"] == 0, (codes, messages)
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED", "UNAVAILABLE"}, (codes, messages)
    unavailable = {m for m in messages if not m.startswith("the server is overloaded")}
    assert all("RST_STREAM" in m and "error code 7" in m for m in unavailable), unavailable

    with running_server(tiny_repository, max_streams_per_connection=None) as srv:
        codes, messages = _send_while_blocked(srv, FLOOD, FLOOD_BLOCK, after=0)
    print(f"the same, no limit: {dict(codes)}")
    assert codes["CANCELLED"] > 0, (codes, messages)
