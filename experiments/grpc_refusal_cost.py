"""`python experiments/grpc_refusal_cost.py`: what a refused call costs a grpc.aio server, against
a served one, with no model: the floor under shedding overload over gRPC.

For each way of answering, a bare grpc.aio server (one generic handler, raw bytes, in its own
process) and a closed loop of 128 grpc.aio callers over 2 channels for `--seconds`; the server's
CPU (utime + stime from /proc) over the window, divided by the calls answered:

- serve: a unary handler that returns 2 bytes (an echo, the cheapest served call);
- serve-registered: the same handler as a registered method (grpc.aio finds it without
  calling a generic handler in Python, as textserve's services are added);
- abort: a unary handler that aborts RESOURCE_EXHAUSTED, as textserve's backlog guard refuses
  (grpc.aio reads the request message and runs the handler first);
- abort-unread: a stream-unary handler that aborts at once (the request message never read);
- no-handler: the generic handler finds none, grpc.aio answers UNIMPLEMENTED itself (no
  handler, no servicer context: the least grpc.aio can spend on a call at all).

If refusing costs most of what serving does, a server past its peak spends on refusals the CPU
it would serve with: at 1.5x the peak, a refusal costing half a served call leaves half the
peak served (docs/performance.md, "The load generator on a core of its own").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time

import grpc

from textserve import procfs

MODES = ("serve", "serve-registered", "abort", "abort-unread", "no-handler")
MESSAGE = "over the backlog target"


def _handler(mode: str) -> grpc.RpcMethodHandler | None:
    async def serve(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b"ok"

    async def abort(request: bytes, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, MESSAGE)

    async def abort_unread(requests: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, MESSAGE)

    return {
        "serve": grpc.unary_unary_rpc_method_handler(serve),
        "serve-registered": grpc.unary_unary_rpc_method_handler(serve),
        "abort": grpc.unary_unary_rpc_method_handler(abort),
        "abort-unread": grpc.stream_unary_rpc_method_handler(abort_unread),
        "no-handler": None,
    }[mode]


async def _serve(mode: str) -> None:
    handler = _handler(mode)

    class Generic(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
            return handler

    server = grpc.aio.server()
    if mode == "serve-registered" and handler is not None:
        server.add_registered_method_handlers("experiment.Refusal", {"Call": handler})
    else:
        server.add_generic_rpc_handlers((Generic(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


async def _closed_loop(port: int, seconds: float, callers: int = 128) -> int:
    channels = [
        grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(2)
    ]
    calls = [channel.unary_unary("/experiment.Refusal/Call") for channel in channels]
    answered = 0
    stop = time.monotonic() + seconds

    async def caller(index: int) -> None:
        nonlocal answered
        call = calls[index % len(calls)]
        while time.monotonic() < stop:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await call(b"x" * 40)
            answered += 1

    await asyncio.gather(*(caller(i) for i in range(callers)))
    for channel in channels:
        await channel.close()
    return answered


def _cpu_seconds(pid: int) -> float:
    stat = procfs.process_stat(pid)
    assert stat is not None, f"the server (pid {pid}) is gone"
    return stat.cpu_seconds


def measure(mode: str, seconds: float) -> tuple[float, float]:
    """(calls answered a second, server CPU ms a call) for one way of answering."""
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", mode], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        asyncio.run(_closed_loop(port, 2.0))  # warm up
        before = _cpu_seconds(server.pid)
        answered = asyncio.run(_closed_loop(port, seconds))
        cpu = _cpu_seconds(server.pid) - before
    finally:
        server.terminate()
        server.wait()
    return answered / seconds, 1000 * cpu / answered


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--rounds", type=int, default=2, help="each mode this many times, interleaved"
    )
    parser.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return 0
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            rate, cost = measure(mode, args.seconds)
            results[mode].append(cost)
            print(f"{mode:13} {rate:8,.0f} calls/s  {cost:.3f} ms of server CPU a call", flush=True)
    serve = sorted(results["serve"])[len(results["serve"]) // 2]
    print("\nmedian ms of server CPU a call, and against serving:")
    for mode, costs in results.items():
        median = sorted(costs)[len(costs) // 2]
        print(f"| {mode} | {median:.3f} | {median / serve:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
